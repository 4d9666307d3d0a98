//! The gRPC conventions served beside the page service, so that common tools work against it:
//! the standard health service (`grpc.health.v1.Health`, tonic-health: Kubernetes gRPC probes,
//! `grpc_health_probe`) and server reflection (`grpc.reflection.v1` and `v1alpha`,
//! tonic-reflection: grpcurl, grpcui).
//!
//! Health: the server as a whole (the empty service name) and the page service
//! (`pageserver.page.v1.PageService`) are SERVING from the moment the server listens, and NOT_SERVING
//! once shutdown begins. A `Watch` stream sees that change and then ends, so that a watcher does
//! not hold the graceful shutdown up (a stream open at shutdown is waited for, up to
//! [`super::SHUTDOWN_GRACE`]). Any other name is NOT_FOUND, as the protocol says.
//!
//! Reflection describes the page service, the health service and reflection itself, from the
//! file descriptor sets compiled into the binary.
//!
//! Neither asks for a token, even with auth on: probes and `grpc_health_probe` send none, what
//! they answer is whether the server serves, and reflection tells the schema, which is the
//! published `.proto`. Neither reads a tenant's data; the page service's own calls check the
//! token as before.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::stream::Stream;
use page_api::proto::page_service_server::SERVICE_NAME as PAGE_SERVICE;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus as WireStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};
use tonic_health::ServingStatus;

/// The health service: SERVING for the server and the page service until `shutdown` turns true,
/// NOT_SERVING from then on.
pub async fn health_service(shutdown: watch::Receiver<bool>) -> HealthServer<ShutdownAwareHealth> {
    HealthServer::new(health(shutdown).await)
}

/// What [`health_service`] serves.
async fn health(shutdown: watch::Receiver<bool>) -> ShutdownAwareHealth {
    // A new reporter has the server itself ("") SERVING.
    let reporter = HealthReporter::new();
    reporter
        .set_service_status(PAGE_SERVICE, ServingStatus::Serving)
        .await;
    let inner = HealthService::from_health_reporter(reporter.clone());
    let mut stopping = shutdown.clone();
    tokio::spawn(async move {
        let _ = stopping.wait_for(|stopping| *stopping).await;
        for name in ["", PAGE_SERVICE] {
            reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
    });
    ShutdownAwareHealth { inner, shutdown }
}

/// tonic-health's service, with `Watch` streams that end at shutdown.
pub struct ShutdownAwareHealth {
    inner: HealthService,
    shutdown: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl Health for ShutdownAwareHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.inner.check(request).await
    }

    type WatchStream = EndsAfterShutdown<<HealthService as Health>::WatchStream>;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let statuses = self.inner.watch(request).await?.into_inner();
        Ok(Response::new(EndsAfterShutdown {
            statuses,
            shutdown: self.shutdown.clone(),
            ended: false,
        }))
    }
}

/// A `Watch` stream that ends right after it has sent NOT_SERVING once shutdown began.
pub struct EndsAfterShutdown<S> {
    statuses: S,
    shutdown: watch::Receiver<bool>,
    ended: bool,
}

impl<S> Stream for EndsAfterShutdown<S>
where
    S: Stream<Item = Result<HealthCheckResponse, Status>> + Unpin,
{
    type Item = Result<HealthCheckResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let next = Pin::new(&mut self.statuses).poll_next(cx);
        if let Poll::Ready(Some(Ok(answer))) = &next {
            // The status is set after the shutdown flag turns, so a NOT_SERVING seen with the
            // flag up is the last word.
            if answer.status == WireStatus::NotServing as i32 && *self.shutdown.borrow() {
                self.ended = true;
            }
        }
        next
    }
}

/// Server reflection, `grpc.reflection.v1` and the older `v1alpha` that some clients still ask
/// for, describing the page service, the health service and both reflection services (each
/// version adds its own; the other is registered here, so that both list the same services).
pub fn reflection() -> (
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
) {
    use tonic_reflection::pb::{v1, v1alpha};
    let builder = |other_reflection: &'static [u8]| {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(page_api::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(other_reflection)
    };
    // The descriptor sets are compiled in, and the test below builds both services from them:
    // they cannot fail to decode at run time.
    (
        builder(v1alpha::FILE_DESCRIPTOR_SET)
            .build_v1()
            .expect("the compiled-in descriptor sets decode"),
        builder(v1::FILE_DESCRIPTOR_SET)
            .build_v1alpha()
            .expect("the compiled-in descriptor sets decode"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[test]
    fn the_reflection_services_build_from_the_compiled_descriptors() {
        let _ = reflection();
    }

    fn request(service: &str) -> Request<HealthCheckRequest> {
        Request::new(HealthCheckRequest {
            service: service.to_owned(),
        })
    }

    #[tokio::test]
    async fn serving_until_shutdown_then_not_serving_and_watches_end() {
        let (stop, shutdown) = watch::channel(false);
        let health = health(shutdown).await;
        for name in ["", PAGE_SERVICE] {
            let status = health.check(request(name)).await.unwrap().into_inner();
            assert_eq!(status.status, WireStatus::Serving as i32, "{name:?}");
        }
        let unknown = health.check(request("no.such.Service")).await.unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::NotFound);

        let mut watch = health
            .watch(request(PAGE_SERVICE))
            .await
            .unwrap()
            .into_inner();
        let first = watch.next().await.unwrap().unwrap();
        assert_eq!(first.status, WireStatus::Serving as i32);
        stop.send_replace(true);
        let last = watch.next().await.unwrap().unwrap();
        assert_eq!(last.status, WireStatus::NotServing as i32);
        assert!(
            watch.next().await.is_none(),
            "the watch ends after NOT_SERVING"
        );
        let status = health.check(request("")).await.unwrap().into_inner();
        assert_eq!(status.status, WireStatus::NotServing as i32);
    }
}
