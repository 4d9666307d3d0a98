//! Which access an HTTP request needs, from its path: the token's check is
//! [`crate::serving::auth`]'s, the one rule both doors share.
//!
//! `GET /v1/status` needs none (a load balancer's health check). `/v1/tenant/{tenant_id}` and
//! everything under it is that tenant's data, except deleting, attaching or detaching the
//! tenant, which manage the server, as does every other path.

use axum::http::Method;

use crate::serving::auth::Access;

/// Paths exempt from auth: what a load balancer's health check needs.
pub fn is_public(path: &str) -> bool {
    path == "/v1/status"
}

/// What `method path` needs a token to grant.
pub fn access<'p>(method: &Method, path: &'p str) -> Access<'p> {
    let mut segments = path.trim_start_matches('/').split('/');
    match (segments.next(), segments.next(), segments.next()) {
        (Some("v1"), Some("tenant"), Some(tenant)) if !tenant.is_empty() => {
            let next = segments.next();
            // Deleting, attaching or detaching a tenant manages the server; everything else
            // under it is its data.
            let manages = matches!(next, Some("attach" | "detach"))
                || (next.is_none() && method == Method::DELETE);
            if manages {
                Access::Manage
            } else {
                Access::Tenant(tenant)
            }
        }
        _ => Access::Manage,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1: &str = "0123456789abcdef0123456789abcdef";
    const T2: &str = "00000000000000000000000000000002";

    #[test]
    fn the_access_each_path_needs() {
        let get = Method::GET;
        let page = format!("/v1/tenant/{T1}/timeline/{T2}/page");
        assert_eq!(access(&get, &page), Access::Tenant(T1));
        assert_eq!(
            access(&get, &format!("/v1/tenant/{T1}")),
            Access::Tenant(T1)
        );
        assert_eq!(
            access(&Method::POST, &format!("/v1/tenant/{T1}/timeline")),
            Access::Tenant(T1)
        );
        for manages in [
            (get.clone(), "/v1/tenant".to_owned()),
            (get.clone(), "/v1/tenant/".to_owned()),
            (get.clone(), "/v1/page_cache".to_owned()),
            (get.clone(), "/metrics".to_owned()),
            (Method::DELETE, format!("/v1/tenant/{T1}")),
            (Method::POST, format!("/v1/tenant/{T1}/attach")),
            (Method::POST, format!("/v1/tenant/{T1}/detach")),
        ] {
            assert_eq!(
                access(&manages.0, &manages.1),
                Access::Manage,
                "{manages:?}"
            );
        }
        assert!(is_public("/v1/status"));
        assert!(!is_public("/v1/status/"));
    }
}
