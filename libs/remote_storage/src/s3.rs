//! The S3 backend: an `AmazonS3` client for a bucket and prefix, set up by AWS's conventions and
//! never talking to anything but what the settings and the environment name.
//!
//! What the `remote_storage` table leaves out comes from the environment, as AWS's own tools
//! read it (an empty variable counts as unset):
//!
//! | what | from, first found |
//! |---|---|
//! | region | `region`, `AWS_REGION`, `AWS_DEFAULT_REGION`, `us-east-1` |
//! | endpoint | `endpoint`, `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, `https://s3.<region>.amazonaws.com`; plain HTTP for an `http://` one |
//! | credentials | `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (with `AWS_SESSION_TOKEN`); a web identity (`AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN`); container credentials (`AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` or `_FULL_URI`); the EC2 instance metadata service, only with `use_instance_metadata = true` (at `AWS_EC2_METADATA_SERVICE_ENDPOINT`, else 169.254.169.254) |
//!
//! Without credentials and without `use_instance_metadata`, opening fails at once, naming what
//! to set: `object_store` would otherwise fall back to the instance metadata service, and a
//! server off EC2 would send requests to 169.254.169.254 and wait out their timeouts on every
//! operation. Nothing else of the environment is read (not `object_store`'s own `AWS_*`
//! names, which could change timeouts or allow plain HTTP behind the settings' back).
//!
//! The client's own retries are off: remote storage retries in one place (`retry.rs`). Its
//! timeouts are the [`Deadlines`]: `connect` for TCP and TLS, `request` for a whole request
//! and its answer (every request moves at most a part, see `transfer.rs`).

use std::collections::HashMap;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::{ClientOptions, RetryConfig};

use crate::config::check_endpoint;
use crate::{Deadlines, RemoteError, S3Config};

/// The instance metadata service's address, where `use_instance_metadata` sends requests
/// unless `AWS_EC2_METADATA_SERVICE_ENDPOINT` names another.
const DEFAULT_METADATA_ENDPOINT: &str = "http://169.254.169.254";

/// The `AWS_*` environment variables, read once.
pub(crate) struct Environment(HashMap<String, String>);

impl Environment {
    pub(crate) fn of_process() -> Environment {
        Environment(
            std::env::vars()
                .filter(|(name, _)| name.starts_with("AWS_"))
                .collect(),
        )
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// An opened bucket.
pub(crate) struct OpenedS3 {
    pub store: AmazonS3,
    pub prefix: String,
    /// Bucket, prefix, endpoint, region and where the credentials come from.
    pub description: String,
}

/// Where the credentials come from.
enum Credentials<'a> {
    Static {
        key_id: &'a str,
        secret: &'a str,
        token: Option<&'a str>,
    },
    WebIdentity,
    Container,
    InstanceMetadata {
        endpoint: &'a str,
    },
}

impl Credentials<'_> {
    fn describe(&self) -> String {
        match self {
            Credentials::Static { token: None, .. } => {
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY".to_owned()
            }
            Credentials::Static { token: Some(_), .. } => {
                "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN".to_owned()
            }
            Credentials::WebIdentity => {
                "a web identity (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN)".to_owned()
            }
            Credentials::Container => "the container credentials endpoint".to_owned(),
            Credentials::InstanceMetadata { endpoint } => {
                format!("the EC2 instance metadata service at {endpoint} (use_instance_metadata)")
            }
        }
    }
}

/// Picks the credentials by the rules of the module documentation.
fn credentials<'a>(s3: &S3Config, env: &'a Environment) -> Result<Credentials<'a>, RemoteError> {
    match (
        env.get("AWS_ACCESS_KEY_ID"),
        env.get("AWS_SECRET_ACCESS_KEY"),
    ) {
        (Some(key_id), Some(secret)) => {
            return Ok(Credentials::Static {
                key_id,
                secret,
                token: env.get("AWS_SESSION_TOKEN"),
            })
        }
        (Some(_), None) => {
            return Err(RemoteError::NoCredentials(
                "AWS_ACCESS_KEY_ID is set, AWS_SECRET_ACCESS_KEY is not".to_owned(),
            ))
        }
        (None, Some(_)) => {
            return Err(RemoteError::NoCredentials(
                "AWS_SECRET_ACCESS_KEY is set, AWS_ACCESS_KEY_ID is not".to_owned(),
            ))
        }
        (None, None) => {}
    }
    if env.get("AWS_WEB_IDENTITY_TOKEN_FILE").is_some() && env.get("AWS_ROLE_ARN").is_some() {
        return Ok(Credentials::WebIdentity);
    }
    if env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
        || env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some()
    {
        return Ok(Credentials::Container);
    }
    if s3.use_instance_metadata {
        return Ok(Credentials::InstanceMetadata {
            endpoint: env
                .get("AWS_EC2_METADATA_SERVICE_ENDPOINT")
                .unwrap_or(DEFAULT_METADATA_ENDPOINT),
        });
    }
    Err(RemoteError::NoCredentials(
        "none in the environment: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and \
         AWS_SESSION_TOKEN for temporary ones), or AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN; \
         on EC2, use_instance_metadata = true in remote_storage takes them from the instance \
         metadata service"
            .to_owned(),
    ))
}

/// Builds the client for `s3` (no request is sent), with `env` as the environment.
pub(crate) fn open(
    s3: &S3Config,
    deadlines: &Deadlines,
    env: &Environment,
) -> Result<OpenedS3, RemoteError> {
    install_crypto_provider();
    let region = s3
        .region
        .as_deref()
        .or_else(|| env.get("AWS_REGION"))
        .or_else(|| env.get("AWS_DEFAULT_REGION"))
        .unwrap_or("us-east-1");
    let endpoint = match &s3.endpoint {
        Some(endpoint) => Some(endpoint.as_str()),
        None => {
            let from_env = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"]
                .into_iter()
                .find_map(|name| env.get(name).map(|value| (name, value)));
            if let Some((name, value)) = from_env {
                check_endpoint(name, value).map_err(RemoteError::Config)?;
            }
            from_env.map(|(_, value)| value)
        }
    };
    let credentials = credentials(s3, env)?;
    let options = ClientOptions::new()
        .with_connect_timeout(deadlines.connect)
        .with_timeout(deadlines.request)
        .with_allow_http(endpoint.is_some_and(|e| e.starts_with("http://")));
    let mut builder = AmazonS3Builder::new()
        .with_bucket_name(&s3.bucket)
        .with_region(region)
        .with_virtual_hosted_style_request(false)
        .with_client_options(options)
        // One layer of retries: ours (`retry.rs`).
        .with_retry(RetryConfig {
            max_retries: 0,
            retry_timeout: deadlines.operation,
            ..RetryConfig::default()
        });
    if let Some(endpoint) = endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    builder = match &credentials {
        Credentials::Static {
            key_id,
            secret,
            token,
        } => {
            let builder = builder
                .with_access_key_id(*key_id)
                .with_secret_access_key(*secret);
            match token {
                Some(token) => builder.with_token(*token),
                None => builder,
            }
        }
        Credentials::WebIdentity => pass_through(
            builder,
            env,
            &[
                (
                    "AWS_WEB_IDENTITY_TOKEN_FILE",
                    AmazonS3ConfigKey::WebIdentityTokenFile,
                ),
                ("AWS_ROLE_ARN", AmazonS3ConfigKey::RoleArn),
                ("AWS_ROLE_SESSION_NAME", AmazonS3ConfigKey::RoleSessionName),
                ("AWS_ENDPOINT_URL_STS", AmazonS3ConfigKey::StsEndpoint),
            ],
        ),
        Credentials::Container => pass_through(
            builder,
            env,
            &[
                (
                    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                    AmazonS3ConfigKey::ContainerCredentialsRelativeUri,
                ),
                (
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                    AmazonS3ConfigKey::ContainerCredentialsFullUri,
                ),
                (
                    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
                    AmazonS3ConfigKey::ContainerAuthorizationTokenFile,
                ),
            ],
        ),
        Credentials::InstanceMetadata { endpoint } => builder.with_metadata_endpoint(*endpoint),
    };
    let store = builder
        .build()
        .map_err(|e| RemoteError::Config(format!("S3 bucket {}: {e}", s3.bucket)))?;
    let prefix = s3.prefix.trim_matches('/').to_owned();
    let shown_endpoint = endpoint
        .map(str::to_owned)
        .unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
    let description = format!(
        "S3 bucket {} prefix {prefix:?} at {shown_endpoint} (region {region}, credentials from {})",
        s3.bucket,
        credentials.describe()
    );
    Ok(OpenedS3 {
        store,
        prefix,
        description,
    })
}

/// `builder` with each set variable of `names` as its configuration key.
fn pass_through(
    mut builder: AmazonS3Builder,
    env: &Environment,
    names: &[(&str, AmazonS3ConfigKey)],
) -> AmazonS3Builder {
    for (name, key) in names {
        if let Some(value) = env.get(name) {
            builder = builder.with_config(*key, value);
        }
    }
    builder
}

/// rustls needs one process-wide crypto provider: ring, which we link anyway.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Environment {
        Environment(
            vars.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn bucket() -> S3Config {
        S3Config {
            bucket: "layers".to_owned(),
            prefix: "ps".to_owned(),
            endpoint: None,
            region: None,
            use_instance_metadata: false,
        }
    }

    const KEYS: [(&str, &str); 2] = [("AWS_ACCESS_KEY_ID", "id"), ("AWS_SECRET_ACCESS_KEY", "s")];

    fn described(s3: &S3Config, vars: &[(&str, &str)]) -> String {
        match open(s3, &Deadlines::default(), &env(vars)) {
            Ok(opened) => opened.description,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn region_comes_from_the_settings_then_aws_region_then_aws_default_region() {
        let both = [
            KEYS[0],
            KEYS[1],
            ("AWS_REGION", "eu-west-1"),
            ("AWS_DEFAULT_REGION", "ap-south-1"),
        ];
        let s = described(&bucket(), &both);
        assert!(
            s.contains("region eu-west-1") && s.contains("https://s3.eu-west-1.amazonaws.com"),
            "{s}"
        );
        let s = described(
            &bucket(),
            &[KEYS[0], KEYS[1], ("AWS_DEFAULT_REGION", "ap-south-1")],
        );
        assert!(s.contains("region ap-south-1"), "{s}");
        let s = described(&bucket(), &[KEYS[0], KEYS[1], ("AWS_REGION", "")]);
        assert!(s.contains("region us-east-1"), "{s}");
        let set = S3Config {
            region: Some("us-west-2".to_owned()),
            ..bucket()
        };
        let s = described(&set, &both);
        assert!(s.contains("region us-west-2"), "{s}");
    }

    #[test]
    fn endpoint_comes_from_the_settings_then_the_environment() {
        let s = described(
            &bucket(),
            &[
                KEYS[0],
                KEYS[1],
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"),
            ],
        );
        assert!(s.contains("at http://127.0.0.1:9000 "), "{s}");
        let s = described(
            &bucket(),
            &[
                KEYS[0],
                KEYS[1],
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"),
                ("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9001"),
            ],
        );
        assert!(s.contains("at http://127.0.0.1:9001 "), "{s}");
        let set = S3Config {
            endpoint: Some("http://127.0.0.1:9002".to_owned()),
            ..bucket()
        };
        let s = described(
            &set,
            &[
                KEYS[0],
                KEYS[1],
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"),
            ],
        );
        assert!(s.contains("at http://127.0.0.1:9002 "), "{s}");
        let bad = open(
            &bucket(),
            &Deadlines::default(),
            &env(&[KEYS[0], KEYS[1], ("AWS_ENDPOINT_URL", "127.0.0.1:9000")]),
        );
        let e = bad
            .err()
            .expect("an endpoint without a scheme is refused")
            .to_string();
        assert!(
            e.contains("AWS_ENDPOINT_URL") && e.contains("not an http:// or https:// URL"),
            "{e}"
        );
    }

    #[test]
    fn without_credentials_opening_fails_unless_instance_metadata_is_asked_for() {
        let e = open(&bucket(), &Deadlines::default(), &env(&[]))
            .err()
            .expect("no credentials")
            .to_string();
        assert!(
            e.contains("no S3 credentials") && e.contains("AWS_ACCESS_KEY_ID"),
            "{e}"
        );
        assert!(e.contains("use_instance_metadata"), "{e}");
        let e = open(&bucket(), &Deadlines::default(), &env(&[KEYS[0]]))
            .err()
            .expect("half the credentials")
            .to_string();
        assert!(e.contains("AWS_SECRET_ACCESS_KEY is not"), "{e}");

        let asked = S3Config {
            use_instance_metadata: true,
            ..bucket()
        };
        let s = described(&asked, &[]);
        assert!(
            s.contains("instance metadata service at http://169.254.169.254"),
            "{s}"
        );
        let s = described(
            &asked,
            &[("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:1")],
        );
        assert!(
            s.contains("instance metadata service at http://127.0.0.1:1"),
            "{s}"
        );
        // Credentials in the environment come first.
        let s = described(&asked, &KEYS);
        assert!(s.contains("credentials from AWS_ACCESS_KEY_ID"), "{s}");
    }
}
