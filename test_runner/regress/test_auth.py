"""JWT auth (`http_auth_type = "NeonJWT"`): who may call what.

- /v1/status needs no token.
- Everything else needs `Authorization: Bearer <EdDSA JWT>`; missing, malformed, badly signed
  or expired, or with an `exp` that is not a whole number of seconds: 401.
- scope `pageserverapi`: everything.
- scope `tenant` with `tenant_id`: only /v1/tenant/{that id} and below, except deleting the
  tenant; anything else (other tenants, listing or creating tenants, /metrics, the page cache,
  failpoints): 403.
"""

from __future__ import annotations

import pytest

from fixtures.auth import AuthKeys, start_with_auth
from fixtures.http import api_error
from fixtures.ingest import Image, encode_batch, key, page_of
from fixtures.pageserver import Pageserver
from fixtures.plugin import PageserverFactory


@pytest.fixture
def auth_env(pageserver_factory: PageserverFactory):
    keys = AuthKeys()
    ps = start_with_auth(pageserver_factory, keys)
    admin = ps.http
    t1 = admin.tenant_create()["id"]
    t2 = admin.tenant_create()["id"]
    tl1 = admin.timeline_create(t1)["timeline_id"]
    tl2 = admin.timeline_create(t2)["timeline_id"]
    admin.ingest(t1, tl1, [Image(key(1), 0x10, page_of(1))])
    admin.ingest(t2, tl2, [Image(key(1), 0x10, page_of(2))])
    return ps, keys, (t1, tl1), (t2, tl2)


def requests_for(tenant: str, timeline: str) -> list[tuple[str, str, dict]]:
    """Every data endpoint of one tenant, as (method, path, request kwargs)."""
    base = f"/v1/tenant/{tenant}"
    tl = f"{base}/timeline/{timeline}"
    return [
        ("GET", base, {}),
        ("GET", f"{base}/timeline", {}),
        ("GET", tl, {}),
        ("GET", f"{tl}/layer", {}),
        ("GET", f"{tl}/page", {"params": {"key": key(1).hex(), "lsn": "latest"}}),
        ("PUT", f"{tl}/checkpoint", {}),
        ("POST", f"{tl}/ingest", {"data": b""}),
    ]


MANAGEMENT = [
    ("GET", "/v1/tenant", {}),
    ("POST", "/v1/tenant", {"json": {}}),
    ("GET", "/metrics", {}),
    ("GET", "/v1/page_cache", {}),
    ("POST", "/v1/page_cache/drop", {}),
    ("PUT", "/v1/failpoints", {"json": []}),
]


def call(ps: Pageserver, token: str | None, method: str, path: str, kwargs: dict, headers: dict | None = None):
    client = ps.http_client(token)
    try:
        return client.request(method, path, headers=headers, **kwargs)
    finally:
        client.close()


def test_status_needs_no_token(auth_env):
    ps, *_ = auth_env
    r = call(ps, None, "GET", "/v1/status", {})
    assert r.status_code == 200 and r.json()["id"] == ps.server_id


def test_admin_token_may_do_everything(auth_env):
    ps, keys, (t1, tl1), (t2, tl2) = auth_env
    for method, path, kwargs in requests_for(t1, tl1) + requests_for(t2, tl2) + MANAGEMENT:
        r = call(ps, keys.admin_token(), method, path, kwargs)
        assert r.status_code in (200, 201), (method, path, r.text)
    ps.http.timeline_delete(t2, tl2)
    ps.http.tenant_delete(t2)


@pytest.mark.parametrize(
    "case",
    ["missing", "empty_bearer", "not_bearer", "garbage", "other_key", "expired", "hs256", "none_alg", "exp_string", "exp_negative", "exp_null"],
)
def test_bad_tokens_are_401(auth_env, case: str):
    ps, keys, (t1, tl1), _ = auth_env
    headers = None
    token = None
    if case == "empty_bearer":
        headers = {"Authorization": "Bearer "}
    elif case == "not_bearer":
        headers = {"Authorization": f"Token {keys.admin_token()}"}
    elif case == "garbage":
        token = "not.a.jwt"
    elif case == "other_key":
        token = AuthKeys().admin_token()
    elif case == "expired":
        token = keys.token("pageserverapi", expires_in=-3600)
    elif case.startswith("exp_"):
        # An `exp` that is no time at all does not make a token that never expires.
        exp = {"exp_string": "9999999999", "exp_negative": -1, "exp_null": None}[case]
        token = keys.token("pageserverapi", exp=exp)
    elif case == "hs256":
        import jwt

        token = jwt.encode({"scope": "pageserverapi"}, "a shared secret that is long enough", algorithm="HS256")
    elif case == "none_alg":
        import base64
        import json

        def b64(obj: dict) -> str:
            return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

        token = f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64({'scope': 'pageserverapi'})}."
    for method, path, kwargs in requests_for(t1, tl1) + MANAGEMENT:
        r = call(ps, token, method, path, kwargs, headers=headers)
        assert r.status_code == 401, (case, method, path, r.text)
        api_error(r)


def test_tenant_token_scope(auth_env):
    ps, keys, (t1, tl1), (t2, tl2) = auth_env
    token = keys.tenant_token(t1)
    # Its own tenant: everything.
    for method, path, kwargs in requests_for(t1, tl1):
        r = call(ps, token, method, path, kwargs)
        assert r.status_code == 200, (method, path, r.text)
    r = call(ps, token, "POST", f"/v1/tenant/{t1}/timeline/{tl1}/ingest", {"data": encode_batch([Image(key(2), 0x20, page_of(3))])})
    assert r.status_code == 200, r.text
    r = call(ps, token, "POST", f"/v1/tenant/{t1}/timeline", {"json": {}})
    assert r.status_code == 201, r.text
    new_tl = r.json()["timeline_id"]
    r = call(ps, token, "DELETE", f"/v1/tenant/{t1}/timeline/{new_tl}", {})
    assert r.status_code == 200, r.text
    # Same id in upper case is the same tenant.
    r = call(ps, token, "GET", f"/v1/tenant/{t1.upper()}", {})
    assert r.status_code == 200, r.text
    # Another tenant, the management API, and deleting itself: forbidden.
    forbidden = requests_for(t2, tl2) + MANAGEMENT + [("DELETE", f"/v1/tenant/{t1}", {}), ("DELETE", f"/v1/tenant/{t2}", {})]
    for method, path, kwargs in forbidden:
        r = call(ps, token, method, path, kwargs)
        assert r.status_code == 403, (method, path, r.text)
        assert "permission denied" in api_error(r).msg
    # Nothing was changed by the refused requests.
    assert {t["id"] for t in ps.http.tenant_list()} == {t1, t2}
    assert ps.http.timeline_info(t2, tl2)["last_record_lsn"] == "0/10"


@pytest.mark.parametrize("claims", [{"scope": "tenant"}, {"scope": "safekeeperdata", "tenant_id": "T1"}, {"scope": "tenant", "tenant_id": "zz"}])
def test_tokens_without_a_usable_grant_are_403(auth_env, claims: dict):
    ps, keys, (t1, tl1), _ = auth_env
    claims = {k: (t1 if v == "T1" else v) for k, v in claims.items()}
    token = keys.token(**claims)
    for method, path, kwargs in requests_for(t1, tl1) + MANAGEMENT:
        r = call(ps, token, method, path, kwargs)
        assert r.status_code == 403, (claims, method, path, r.text)


def test_unknown_routes_still_need_a_token(auth_env):
    ps, keys, _, _ = auth_env
    assert call(ps, None, "GET", "/v1/nothing", {}).status_code == 401
    r = call(ps, keys.admin_token(), "GET", "/v1/nothing", {})
    assert r.status_code == 404
    api_error(r)


def test_auth_needs_a_valid_key(pageserver_factory: PageserverFactory):
    # The setting without a key path is refused at startup...
    ps = pageserver_factory.create({"http_auth_type": "NeonJWT"})
    ps.allowed_errors.append("pageserver: error:")
    code, out = ps.run_to_exit()
    assert code == 1 and "auth_validation_public_key_path" in out
    # ... and so is a key that is missing or not an Ed25519 PEM.
    code, out = ps.run_to_exit({"auth_validation_public_key_path": "nowhere.pem"})
    assert code == 1 and "nowhere.pem" in out
    (ps.workdir / "bad.pem").write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    code, out = ps.run_to_exit({"auth_validation_public_key_path": "bad.pem"})
    assert code == 1 and "bad.pem" in out
    # An absolute path works as well as one relative to the work directory.
    keys = AuthKeys()
    pem = keys.write_public_key(ps.workdir.parent / "elsewhere.pem")
    ps.auth_token = keys.admin_token()
    ps.start({"auth_validation_public_key_path": str(pem)})
    assert ps.http.tenant_list() == []
