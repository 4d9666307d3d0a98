//! Optional JWT auth for the HTTP API.
//!
//! With `http_auth_type = "NeonJWT"`, every request but `GET /v1/status` carries
//! `Authorization: Bearer <token>`, an EdDSA-signed JWT verified with the configured public
//! key. Its claims grant one of two scopes:
//!
//! | scope           | may use                                                          |
//! |-----------------|------------------------------------------------------------------|
//! | `pageserverapi` | everything                                                       |
//! | `tenant`        | `/v1/tenant/{its tenant_id}` and everything under it, except deleting the tenant |
//!
//! A missing, malformed or badly signed token is 401; a valid token used outside its scope is
//! 403. Tokens need no expiry; one that has an `exp` claim is checked against it, and an `exp`
//! that is not a whole number of seconds since the Unix epoch (a string, a negative number, a
//! fraction, null) makes the token invalid rather than never expiring.

use std::path::Path;

use axum::http::{Method, StatusCode};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use utils::TenantId;

use crate::http::error::ApiError;

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
    fn check_exp(&self) -> Result<(), ApiError> {
        match &self.exp {
            None => Ok(()),
            Some(exp) if exp.as_u64().is_some() => Ok(()),
            Some(exp) => {
                let shown: String = exp.to_string().chars().take(40).collect();
                Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    format!(
                        "invalid token: its exp claim {shown} is not a whole number of seconds \
                         since the Unix epoch"
                    ),
                ))
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

    fn decode(&self, token: &str) -> Result<Claims, ApiError> {
        let claims = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)
            .map(|data| data.claims)
            .map_err(|e| ApiError::new(StatusCode::UNAUTHORIZED, format!("invalid token: {e}")))?;
        claims.check_exp()?;
        Ok(claims)
    }

    /// Whether a request with this `Authorization` header may use `method path`.
    pub fn check(
        &self,
        authorization: Option<&str>,
        method: &Method,
        path: &str,
    ) -> Result<(), ApiError> {
        let header = authorization.ok_or_else(|| {
            ApiError::new(StatusCode::UNAUTHORIZED, "missing authorization header")
        })?;
        let token = header.strip_prefix("Bearer ").ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "malformed authorization header: expected `Bearer <token>`",
            )
        })?;
        let claims = self.decode(token.trim())?;
        check_permission(&claims, method, path)
    }

    /// Whether a call with this `authorization` value may read tenant `tenant`'s data: what
    /// the page service (gRPC) checks, with the same tokens, scopes and messages as HTTP.
    pub fn check_tenant(
        &self,
        authorization: Option<&str>,
        tenant: TenantId,
    ) -> Result<(), ApiError> {
        // A tenant's data path as HTTP names it: the one rule decides for both.
        self.check(
            authorization,
            &Method::GET,
            &format!("/v1/tenant/{tenant}/timeline"),
        )
    }
}

/// Paths exempt from auth: what a load balancer's health check needs.
pub fn is_public(path: &str) -> bool {
    path == "/v1/status"
}

/// The tenant a request is about, if it is one of that tenant's data paths.
fn tenant_of<'p>(method: &Method, path: &'p str) -> Option<&'p str> {
    let mut segments = path.trim_start_matches('/').split('/');
    match (segments.next(), segments.next(), segments.next()) {
        (Some("v1"), Some("tenant"), Some(tenant)) if !tenant.is_empty() => {
            let next = segments.next();
            // Deleting, attaching or detaching a tenant manages the server; everything else
            // under it is its data.
            let manages = matches!(next, Some("attach" | "detach"))
                || (next.is_none() && method == Method::DELETE);
            (!manages).then_some(tenant)
        }
        _ => None,
    }
}

fn check_permission(claims: &Claims, method: &Method, path: &str) -> Result<(), ApiError> {
    let forbidden = |msg: &str| Err(ApiError::new(StatusCode::FORBIDDEN, msg));
    match claims.scope {
        Scope::PageServerApi => Ok(()),
        Scope::Tenant => {
            let Some(tenant) = tenant_of(method, path) else {
                return forbidden(
                    "attempt to access the management API with a tenant token: permission denied",
                );
            };
            let claimed = claims
                .tenant_id
                .as_deref()
                .and_then(|id| id.parse::<TenantId>().ok());
            match (claimed, tenant.parse::<TenantId>()) {
                (Some(claimed), Ok(requested)) if claimed == requested => Ok(()),
                _ => forbidden("tenant id mismatch: permission denied"),
            }
        }
        Scope::Other => forbidden("the token's scope grants nothing on this server"),
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
            auth.check(Some(&header), &Method::GET, "/v1/tenant")
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
        assert_eq!(expired.status, StatusCode::UNAUTHORIZED);
        for bad in [
            serde_json::json!("9999999999"),
            serde_json::json!(-1),
            serde_json::json!(null),
            serde_json::json!(1.5e10),
        ] {
            let e = check(admin(Some(bad.clone()))).unwrap_err();
            assert_eq!(e.status, StatusCode::UNAUTHORIZED, "{bad}");
            assert!(e.msg.contains("exp claim"), "{bad}: {}", e.msg);
        }
    }

    #[test]
    fn the_permission_matrix() {
        let get = Method::GET;
        let admin = claims(Scope::PageServerApi, None);
        let tenant = claims(Scope::Tenant, Some(T1));
        let page = format!("/v1/tenant/{T1}/timeline/{T2}/page");
        let other_page = format!("/v1/tenant/{T2}/timeline/{T2}/page");
        for path in ["/v1/tenant", "/v1/page_cache", "/metrics", page.as_str()] {
            assert!(check_permission(&admin, &get, path).is_ok(), "{path}");
        }
        assert!(check_permission(&tenant, &get, &page).is_ok());
        assert!(check_permission(&tenant, &get, &format!("/v1/tenant/{T1}")).is_ok());
        let status =
            |c: &Claims, m: &Method, p: &str| check_permission(c, m, p).unwrap_err().status;
        assert_eq!(status(&tenant, &get, &other_page), StatusCode::FORBIDDEN);
        assert_eq!(status(&tenant, &get, "/v1/tenant"), StatusCode::FORBIDDEN);
        assert_eq!(status(&tenant, &get, "/metrics"), StatusCode::FORBIDDEN);
        assert_eq!(
            status(&tenant, &Method::DELETE, &format!("/v1/tenant/{T1}")),
            StatusCode::FORBIDDEN
        );
        let no_tenant = claims(Scope::Tenant, None);
        assert_eq!(status(&no_tenant, &get, &page), StatusCode::FORBIDDEN);
        let stranger = claims(Scope::Other, Some(T1));
        assert_eq!(status(&stranger, &get, &page), StatusCode::FORBIDDEN);
    }
}
