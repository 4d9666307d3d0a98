//! Which backend, and where: `remote_storage = { local_path = "...", hard_links = false }` or
//! `remote_storage = { bucket = "...", prefix = "...", endpoint = "...", region = "...",
//! use_instance_metadata = false }`. What the S3 fields leave out comes from the environment
//! by AWS's conventions (`s3.rs`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// See the crate documentation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawConfig", into = "RawConfig")]
pub enum RemoteStorageConfig {
    /// Objects are files under this directory.
    LocalFs {
        local_path: PathBuf,
        /// Whether an upload of a file its caller declares immutable makes the object a hard
        /// link to it, where the directory is on the file's file system, rather than write its
        /// bytes a second time. The two names then share one inode, and the object shares the
        /// local file's fate (`local_link.rs`). Off by default: an object is a copy.
        hard_links: bool,
    },
    S3(S3Config),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Config {
    pub bucket: String,
    /// Prepended to every key, without a leading or trailing `/`; may be empty.
    pub prefix: String,
    /// The S3 API endpoint (`http://127.0.0.1:9000` for a local server); `None`:
    /// `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`, else AWS's endpoint of the region.
    pub endpoint: Option<String>,
    /// `None`: `AWS_REGION`, else `AWS_DEFAULT_REGION`, else `us-east-1`.
    pub region: Option<String>,
    /// Whether credentials may come from the EC2 instance metadata service when the
    /// environment has none. Off by default: a server that is not on EC2 would send requests
    /// to 169.254.169.254 and wait for them to time out.
    pub use_instance_metadata: bool,
}

impl RemoteStorageConfig {
    /// A local directory with the defaults: every object a copy.
    pub fn local_dir(local_path: impl Into<PathBuf>) -> RemoteStorageConfig {
        RemoteStorageConfig::LocalFs {
            local_path: local_path.into(),
            hard_links: false,
        }
    }
}

/// The table as written: the fields of either backend, checked by `TryFrom`.
#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    local_path: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hard_links: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bucket: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    endpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    region: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    use_instance_metadata: Option<bool>,
}

impl TryFrom<RawConfig> for RemoteStorageConfig {
    type Error = String;

    fn try_from(raw: RawConfig) -> Result<Self, String> {
        match (raw.local_path, raw.bucket) {
            (Some(_), Some(_)) => Err(
                "remote_storage has both local_path (a directory) and bucket (S3): choose one"
                    .to_owned(),
            ),
            (None, None) => Err(
                "remote_storage needs local_path (a directory) or bucket (an S3 bucket)".to_owned(),
            ),
            (Some(local_path), None) => {
                if let Some(field) = [
                    ("prefix", raw.prefix.is_some()),
                    ("endpoint", raw.endpoint.is_some()),
                    ("region", raw.region.is_some()),
                    ("use_instance_metadata", raw.use_instance_metadata.is_some()),
                ]
                .iter()
                .find(|(_, set)| *set)
                {
                    return Err(format!(
                        "remote_storage: {} is an S3 setting, and local_path names a directory",
                        field.0
                    ));
                }
                if local_path.as_os_str().is_empty() {
                    return Err("remote_storage: local_path is empty".to_owned());
                }
                Ok(RemoteStorageConfig::LocalFs {
                    local_path,
                    hard_links: raw.hard_links.unwrap_or(false),
                })
            }
            (None, Some(bucket)) => {
                if raw.hard_links.is_some() {
                    return Err(
                        "remote_storage: hard_links is a local_path setting, and bucket names S3"
                            .to_owned(),
                    );
                }
                if bucket.is_empty() {
                    return Err("remote_storage: bucket is empty".to_owned());
                }
                if let Some(endpoint) = &raw.endpoint {
                    check_endpoint("remote_storage: endpoint", endpoint)?;
                }
                if raw.region.as_deref() == Some("") {
                    return Err(
                        "remote_storage: region is empty (leave it out for AWS_REGION or us-east-1)"
                            .to_owned(),
                    );
                }
                let prefix = raw.prefix.unwrap_or_default();
                let prefix = prefix.trim_matches('/').to_owned();
                if prefix.split('/').any(|s| s == "." || s == "..")
                    || prefix.contains("//")
                    || !prefix.bytes().all(|b| b.is_ascii_graphic())
                {
                    return Err(format!(
                        "remote_storage: prefix {prefix:?} must be printable ASCII segments, none empty, `.` or `..`"
                    ));
                }
                Ok(RemoteStorageConfig::S3(S3Config {
                    bucket,
                    prefix,
                    endpoint: raw.endpoint,
                    region: raw.region,
                    use_instance_metadata: raw.use_instance_metadata.unwrap_or(false),
                }))
            }
        }
    }
}

impl From<RemoteStorageConfig> for RawConfig {
    fn from(config: RemoteStorageConfig) -> RawConfig {
        match config {
            RemoteStorageConfig::LocalFs {
                local_path,
                hard_links,
            } => RawConfig {
                local_path: Some(local_path),
                hard_links: hard_links.then_some(true),
                ..RawConfig::default()
            },
            RemoteStorageConfig::S3(s3) => RawConfig {
                bucket: Some(s3.bucket),
                prefix: Some(s3.prefix),
                endpoint: s3.endpoint,
                region: s3.region,
                use_instance_metadata: s3.use_instance_metadata.then_some(true),
                ..RawConfig::default()
            },
        }
    }
}

/// An endpoint must be an `http://` or `https://` URL; `what` names where it came from.
pub(crate) fn check_endpoint(what: &str, endpoint: &str) -> Result<(), String> {
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"));
    match rest {
        Some(host) if !host.is_empty() && !host.starts_with('/') => Ok(()),
        _ => Err(format!(
            "{what} {endpoint:?} is not an http:// or https:// URL with a host"
        )),
    }
}
