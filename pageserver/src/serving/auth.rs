//! Optional JWT auth, one rule for both doors.
//!
//! With `http_auth_type = "NeonJWT"`, every HTTP request but `GET /v1/status` and every page
//! service call carries `Authorization: Bearer <token>`, an EdDSA-signed JWT verified with the
//! configured public key. Its claims grant one of two scopes:
//!
//! | scope           | may use                                                          |
//! |-----------------|------------------------------------------------------------------|
//! | `pageserverapi` | everything                                                       |
//! | `tenant`        | its own tenant's data ([`Access::Tenant`])                       |
//!
//! A tenant's data is, over HTTP, `/v1/tenant/{its tenant_id}` and everything under it except
//! deleting, attaching or detaching the tenant; on the page service, every call for it.
//!
//! Which [`Access`] a request needs is its door's to say (`http::auth` from the path, the page
//! service from its tenant metadata); whether a token grants it is decided here. A missing,
//! malformed or badly signed token is [`ErrorKind::Unauthenticated`] (401); a valid token used
//! outside its scope is [`ErrorKind::Forbidden`] (403). Tokens need no expiry; one that has an
//! `exp` claim is checked against it, and an `exp` that is not a whole number of seconds since
//! the Unix epoch (a string, a negative number, a fraction, null) makes the token invalid
//! rather than never expiring.

use std::path::Path;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use utils::TenantId;

use super::error::{ErrorKind, ServeError};

fn unauthenticated(msg: impl Into<String>) -> ServeError {
    ServeError::new(ErrorKind::Unauthenticated, msg)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Scope {
    #[serde(rename = "pageserverapi")]
    PageServerApi,
    #[serde(rename = "tenant")]
    Tenant,
    /// Scopes of other services; they grant nothing here.
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Claims {
    pub scope: Scope,
    pub tenant_id: Option<String>,
    /// The `exp` claim as sent, `Some(Null)` for an explicit null. The JWT library checks an
    /// `exp` that is a `u64` and skips any other, so the others are refused here.
    #[serde(default, deserialize_with = "present")]
    pub exp: Option<serde_json::Value>,
}

/// A field that is there, even as `null`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

impl Claims {
    fn check_exp(&self) -> Result<(), ServeError> {
        match &self.exp {
            None => Ok(()),
            Some(exp) if exp.as_u64().is_some() => Ok(()),
            Some(exp) => {
                let shown: String = exp.to_string().chars().take(40).collect();
                Err(unauthenticated(format!(
                    "invalid token: its exp claim {shown} is not a whole number of seconds \
                         since the Unix epoch"
                )))
            }
        }
    }
}

/// The verifier: the public key and the rules a token must meet.
#[derive(Clone)]
pub struct JwtAuth {
    key: DecodingKey,
    validation: Validation,
}

impl JwtAuth {
    /// Reads an Ed25519 public key in PEM form.
    pub fn from_key_path(path: &Path) -> anyhow::Result<JwtAuth> {
        let pem = std::fs::read(path)
            .map_err(|e| anyhow::anyhow!("auth public key {}: {e}", path.display()))?;
        let key = DecodingKey::from_ed_pem(&pem).map_err(|e| {
            anyhow::anyhow!(
                "auth public key {}: not an Ed25519 PEM key: {e}",
                path.display()
            )
        })?;
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.required_spec_claims.clear();
        // Tokens name no audience here; one that does is not refused for it.
        validation.validate_aud = false;
        Ok(JwtAuth { key, validation })
    }

    fn decode(&self, token: &str) -> Result<Claims, ServeError> {
        let claims = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)
            .map(|data| data.claims)
            .map_err(|e| unauthenticated(format!("invalid token: {e}")))?;
        claims.check_exp()?;
        Ok(claims)
    }

    /// The claims of the token in an `Authorization` value (`Bearer <token>`), once it is
    /// verified.
    pub fn verify(&self, authorization: Option<&str>) -> Result<Claims, ServeError> {
        let header =
            authorization.ok_or_else(|| unauthenticated("missing authorization header"))?;
        let token = header.strip_prefix("Bearer ").ok_or_else(|| {
            unauthenticated("malformed authorization header: expected `Bearer <token>`")
        })?;
        self.decode(token.trim())
    }

    /// Whether a request with this `Authorization` value may have `access`.
    pub fn check(&self, authorization: Option<&str>, access: Access) -> Result<(), ServeError> {
        self.verify(authorization)?.allow(access)
    }
}

/// What a request needs a token to grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access<'a> {
    /// Managing the server: tenants as a whole, the page cache, metrics, failpoints.
    Manage,
    /// One tenant's data, named as the request names it (an id that does not parse is no
    /// tenant a token can claim).
    Tenant(&'a str),
}

impl Claims {
    /// Whether these (verified) claims grant `access`.
    pub fn allow(&self, access: Access) -> Result<(), ServeError> {
        let forbidden = |msg: &str| Err(ServeError::new(ErrorKind::Forbidden, msg));
        match (self.scope, access) {
            (Scope::PageServerApi, _) => Ok(()),
            (Scope::Tenant, Access::Manage) => forbidden(
                "attempt to access the management API with a tenant token: permission denied",
            ),
            (Scope::Tenant, Access::Tenant(tenant)) => {
                let claimed = self
                    .tenant_id
                    .as_deref()
                    .and_then(|id| id.parse::<TenantId>().ok());
                match (claimed, tenant.parse::<TenantId>()) {
                    (Some(claimed), Ok(requested)) if claimed == requested => Ok(()),
                    _ => forbidden("tenant id mismatch: permission denied"),
                }
            }
            (Scope::Other, _) => forbidden("the token's scope grants nothing on this server"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1: &str = "0123456789abcdef0123456789abcdef";
    const T2: &str = "00000000000000000000000000000002";

    fn claims(scope: Scope, tenant: Option<&str>) -> Claims {
        Claims {
            scope,
            tenant_id: tenant.map(str::to_owned),
            exp: None,
        }
    }

    /// A key pair made for these tests only.
    const PRIVATE_PEM: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIDeRnF7WLlHJkkR7DAdYbX2wiPqQ8FeNR1cXLAhWRkUe
-----END PRIVATE KEY-----
";
    const PUBLIC_PEM: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEA755Bq0hPfuu8TeE0P289w7kdd2xzas1BHCtVjP9DsXM=
-----END PUBLIC KEY-----
";

    fn token(claims: serde_json::Value) -> String {
        let key = jsonwebtoken::EncodingKey::from_ed_pem(PRIVATE_PEM.as_bytes()).unwrap();
        jsonwebtoken::encode(&jsonwebtoken::Header::new(Algorithm::EdDSA), &claims, &key).unwrap()
    }

    #[test]
    fn exp_is_a_whole_number_or_absent() {
        let dir = tempfile::tempdir().unwrap();
        let key_path = dir.path().join("public.pem");
        std::fs::write(&key_path, PUBLIC_PEM).unwrap();
        let auth = JwtAuth::from_key_path(&key_path).unwrap();
        let check = |claims: serde_json::Value| {
            let header = format!("Bearer {}", token(claims));
            auth.check(Some(&header), Access::Manage)
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let admin = |exp: Option<serde_json::Value>| {
            let mut claims = serde_json::json!({ "scope": "pageserverapi" });
            if let Some(exp) = exp {
                claims["exp"] = exp;
            }
            claims
        };
        assert!(check(admin(None)).is_ok());
        assert!(check(admin(Some((now + 3600).into()))).is_ok());
        let expired = check(admin(Some((now - 3600).into()))).unwrap_err();
        assert_eq!(expired.kind, ErrorKind::Unauthenticated);
        for bad in [
            serde_json::json!("9999999999"),
            serde_json::json!(-1),
            serde_json::json!(null),
            serde_json::json!(1.5e10),
        ] {
            let e = check(admin(Some(bad.clone()))).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Unauthenticated, "{bad}");
            assert!(e.msg.contains("exp claim"), "{bad}: {}", e.msg);
        }
    }

    #[test]
    fn what_each_scope_grants() {
        let admin = claims(Scope::PageServerApi, None);
        let tenant = claims(Scope::Tenant, Some(T1));
        for access in [Access::Manage, Access::Tenant(T1), Access::Tenant(T2)] {
            assert!(admin.allow(access).is_ok(), "{access:?}");
        }
        assert!(tenant.allow(Access::Tenant(T1)).is_ok());
        let kind = |c: &Claims, access| c.allow(access).unwrap_err().kind;
        assert_eq!(kind(&tenant, Access::Tenant(T2)), ErrorKind::Forbidden);
        assert_eq!(
            kind(&tenant, Access::Tenant("not-an-id")),
            ErrorKind::Forbidden
        );
        assert_eq!(kind(&tenant, Access::Manage), ErrorKind::Forbidden);
        let no_tenant = claims(Scope::Tenant, None);
        assert_eq!(kind(&no_tenant, Access::Tenant(T1)), ErrorKind::Forbidden);
        let stranger = claims(Scope::Other, Some(T1));
        assert_eq!(kind(&stranger, Access::Tenant(T1)), ErrorKind::Forbidden);
    }

    #[test]
    fn a_header_that_is_not_a_bearer_token_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key_path = dir.path().join("public.pem");
        std::fs::write(&key_path, PUBLIC_PEM).unwrap();
        let auth = JwtAuth::from_key_path(&key_path).unwrap();
        let admin = token(serde_json::json!({ "scope": "pageserverapi" }));
        assert!(auth
            .check(Some(&format!("Bearer {admin}")), Access::Manage)
            .is_ok());
        for header in [None, Some(admin.as_str()), Some("Bearer x.y.z")] {
            let e = auth.check(header, Access::Manage).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Unauthenticated, "{header:?}");
        }
    }
}
