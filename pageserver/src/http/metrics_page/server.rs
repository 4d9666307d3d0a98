//! The build that answers ([`BuildInfoCollector`]) and the HTTP limits in use
//! ([`HttpLimitsCollector`]: connections open and their cap, request body bytes reserved and
//! their budget), read at every scrape.

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;

use super::family::Family;
use crate::http::body_limits::BodyBudget;
use crate::serving::connections::ConnectionLimit;

/// `pageserver_build_info{version, features}` 1. Its one series never changes, so it is made
/// once and cloned at each scrape.
pub struct BuildInfoCollector {
    family: Family,
    series: MetricFamily,
}

impl Default for BuildInfoCollector {
    fn default() -> BuildInfoCollector {
        let family = Family::gauge(
            "pageserver_build_info",
            "The build that answers: its version and Cargo features",
            &["version", "features"],
        );
        let features = if crate::failpoints::ENABLED {
            "testing"
        } else {
            ""
        };
        let mut samples = family.fill(1);
        samples.add(&[env!("CARGO_PKG_VERSION"), features], 1.0);
        let series = samples.done();
        BuildInfoCollector { family, series }
    }
}

impl Collector for BuildInfoCollector {
    fn desc(&self) -> Vec<&Desc> {
        vec![self.family.desc()]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        vec![self.series.clone()]
    }
}

/// The `pageserver_http_connections*` and `pageserver_http_request_body_*` gauges.
pub struct HttpLimitsCollector {
    connections: Arc<ConnectionLimit>,
    body_budget: Arc<BodyBudget>,
    open: Family,
    max: Family,
    body_bytes: Family,
    body_budget_bytes: Family,
}

impl HttpLimitsCollector {
    pub fn new(
        connections: Arc<ConnectionLimit>,
        body_budget: Arc<BodyBudget>,
    ) -> HttpLimitsCollector {
        HttpLimitsCollector {
            connections,
            body_budget,
            open: Family::gauge(
                "pageserver_http_connections",
                "HTTP connections open now",
                &[],
            ),
            max: Family::gauge(
                "pageserver_http_connections_max",
                "The most HTTP connections open at once (max_connections); more wait to be \
                 accepted",
                &[],
            ),
            body_bytes: Family::gauge(
                "pageserver_http_request_body_bytes",
                "Request body bytes reserved by requests being read and handled now",
                &[],
            ),
            body_budget_bytes: Family::gauge(
                "pageserver_http_request_body_budget_bytes",
                "The most request body bytes reserved at once (max_buffered_request_bytes)",
                &[],
            ),
        }
    }
}

impl Collector for HttpLimitsCollector {
    fn desc(&self) -> Vec<&Desc> {
        [
            &self.open,
            &self.max,
            &self.body_bytes,
            &self.body_budget_bytes,
        ]
        .map(Family::desc)
        .to_vec()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        vec![
            self.open.single(self.connections.open() as f64),
            self.max.single(self.connections.max() as f64),
            self.body_bytes.single(self.body_budget.used_bytes() as f64),
            self.body_budget_bytes
                .single(self.body_budget.capacity_bytes() as f64),
        ]
    }
}
