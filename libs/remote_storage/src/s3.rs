//! The S3 backend: an `AmazonS3` store for a bucket and prefix.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::ObjectStore;

use crate::{RemoteError, S3Config};

/// The store, the key prefix and a description of where it is.
pub(crate) fn open(s3: &S3Config) -> Result<(Arc<dyn ObjectStore>, String, String), RemoteError> {
    install_crypto_provider();
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(&s3.bucket)
        .with_region(&s3.region)
        .with_virtual_hosted_style_request(false)
        // Our retries log every failure with its key; the client's own retry
        // loop only covers the network blips below that.
        .with_retry(object_store::RetryConfig {
            max_retries: 2,
            retry_timeout: Duration::from_secs(10),
            ..Default::default()
        });
    if let Some(endpoint) = &s3.endpoint {
        builder = builder
            .with_endpoint(endpoint)
            .with_allow_http(endpoint.starts_with("http://"));
    }
    let store = builder
        .build()
        .map_err(|e| RemoteError::Config(format!("S3 bucket {}: {e}", s3.bucket)))?;
    let prefix = s3.prefix.trim_matches('/').to_owned();
    let description = format!(
        "S3 bucket {} prefix {:?} at {}",
        s3.bucket,
        prefix,
        s3.endpoint
            .as_deref()
            .unwrap_or("the AWS endpoint of its region")
    );
    Ok((Arc::new(store), prefix, description))
}

/// rustls needs one process-wide crypto provider: ring, which we link anyway.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
