"""docs/openapi.yaml checked against the real server by an independent tool: schemathesis
generates requests from the description, valid ones and invalid ones, sends them, and checks
every answer against it: no server error, only documented statuses and content types, bodies
and headers that match their schemas, invalid requests refused, valid ones not refused.

Deterministic (derandomized, no example database) and bounded: EXAMPLES cases per operation,
mode and set of ids (a quarter of that with auth on), about 3,100 in all."""

from __future__ import annotations

import time
from collections import Counter
from typing import Optional

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from fixtures.auth import AuthKeys
from fixtures.binary import REPO_ROOT
from fixtures.ingest import Image, delta, key, page_of
from fixtures.plugin import PageserverFactory
from fixtures.timeline import TimelineHandle

SPEC = REPO_ROOT / "docs" / "openapi.yaml"
# Cases per (operation, valid or invalid, generated or the fixture's ids).
EXAMPLES = 80



@schemathesis.check
def no_server_error(ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case) -> None:
    """No 5xx, except the documented 503 of a read that waited `wait_lsn_timeout` for an LSN
    not ingested yet (generated LSNs are mostly far ahead of the fixture's)."""
    if response.status_code < 500:
        return
    if response.status_code == 503 and "waiting for LSN" in response.text:
        return
    raise AssertionError(f"server error {response.status_code}: {response.text[:1000]}")


CHECKS = [
    no_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
    schemathesis.checks.response_headers_conformance,
    schemathesis.checks.negative_data_rejection,
    schemathesis.checks.positive_data_acceptance,
]

# Operations whose validity the description cannot fully state, so a valid-looking request may
# rightly be refused with 400: a scan's `start` must not be above its `end` and its page token
# carries a checksum; an ingest body must decode as records, an import body as a tar archive of
# a data directory; a timestamp must be a real date, not in the future for a basebackup, which
# takes `lsn` or `timestamp` but not both (docs/http-api.md). For them every
# check runs but the one that valid requests are accepted.
POSITIVE_MAY_BE_REFUSED = {
    ("GET", "/v1/tenant/{tenant_id}/timeline/{timeline_id}/keys"),
    ("POST", "/v1/tenant/{tenant_id}/timeline/{timeline_id}/ingest"),
    ("PUT", "/v1/tenant/{tenant_id}/timeline/{timeline_id}/import"),
    ("GET", "/v1/tenant/{tenant_id}/timeline/{timeline_id}/basebackup"),
    ("GET", "/v1/tenant/{tenant_id}/timeline/{timeline_id}/lsn_by_timestamp"),
}


def excluded(method: str, path: str, fixed_ids: bool) -> Optional[str]:
    """Why an operation is not fuzzed (with the fixture's ids, or at all), or None."""
    if path == "/v1/failpoints":
        return "arms failpoints: `exit`, `panic` and `pause` would stop or hang the server under test"
    if path.endswith("/wal_receiver") and method == "PUT":
        return "connects to the host its body names: generated hosts would send packets beyond 127.0.0.1"
    if fixed_ids and method == "DELETE":
        return "would delete the fixture's tenant or timeline, leaving the rest of the run only 404s"
    if fixed_ids and path.endswith("/detach"):
        return "would detach the fixture's tenant, leaving the rest of the run only 404s"
    return None


# About 60 s (auth off) and 20 s (auth on) on the 2-core CI machine: more than the suite's
# default per-test timeout allows for.
@pytest.mark.timeout(300)
@pytest.mark.parametrize("auth", ["off", "on"])
def test_server_matches_its_openapi_description(pageserver_factory: PageserverFactory, auth: str):
    """With auth off (the default), and on with an admin token: the description declares auth
    optional, and every operation's answers must match it either way."""
    # Reads of an LSN not ingested yet wait wait_lsn_timeout before their (documented) 503.
    settings_ = {"wait_lsn_timeout": "1ms"}
    examples = EXAMPLES
    if auth == "on":
        settings_ |= {"http_auth_type": "NeonJWT", "auth_validation_public_key_path": "auth_public_key.pem"}
        # The same operations with a token: a shorter pass.
        examples = EXAMPLES // 4
    ps = pageserver_factory.create(settings_)
    if auth == "on":
        keys = AuthKeys()
        ps.workdir.mkdir(parents=True)
        keys.write_public_key(ps.workdir / "auth_public_key.pem")
        ps.auth_token = keys.admin_token()
    ps.start()
    timeline = TimelineHandle.create(ps)
    timeline.ingest([Image(key(i), 0x10, page_of(i)) for i in range(4)])
    timeline.checkpoint()
    timeline.ingest([delta(key(1), 0x20, (0, b"hi"))])
    ids = {"tenant_id": timeline.tenant_id, "timeline_id": timeline.timeline_id}

    schema = schemathesis.openapi.from_path(str(SPEC))
    session = requests.Session()
    session.trust_env = False  # loopback only, no proxies
    if ps.auth_token is not None:
        session.headers["Authorization"] = f"Bearer {ps.auth_token}"
    failures: list[str] = []
    runs: list[str] = []
    started = time.monotonic()
    cases = 0
    statuses: Counter[int] = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        method, path = operation.method.upper(), operation.path
        for fixed_ids in (False, True):
            if fixed_ids and "{tenant_id}" not in path:
                continue
            if excluded(method, path, fixed_ids):
                continue
            fixed = {k: v for k, v in ids.items() if f"{{{k}}}" in path} if fixed_ids else None
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                label = f"{method} {path} {mode.value}{' with the fixture ids' if fixed_ids else ''}"
                excluded_checks = []
                if (method, path) in POSITIVE_MAY_BE_REFUSED:
                    excluded_checks.append(schemathesis.checks.positive_data_acceptance)
                count = [0]

                @settings(
                    max_examples=examples,
                    derandomize=True,
                    database=None,
                    deadline=None,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck),
                )
                @given(case=operation.as_strategy(mode, path_parameters=fixed))
                def check(case: schemathesis.Case) -> None:
                    count[0] += 1
                    response = case.call_and_validate(
                        base_url=ps.base_url,
                        session=session,
                        checks=CHECKS,
                        excluded_checks=excluded_checks,
                        timeout=30,
                    )
                    statuses[response.status_code] += 1

                try:
                    check()
                except hypothesis.errors.Unsatisfiable:
                    # Nothing of this mode exists (an operation with no input cannot be made
                    # invalid).
                    pass
                except (Exception, BaseExceptionGroup) as e:  # noqa: BLE001 - all are reported
                    failures.append(f"== {label}\n{e}")
                cases += count[0]
                runs.append(f"{label}: {count[0]}")
    took = time.monotonic() - started
    print(f"schemathesis: {cases} cases in {took:.1f} s, statuses {dict(sorted(statuses.items()))}\n" + "\n".join(runs))
    assert not failures, "\n\n".join(failures)
    # The run is bounded, yet not empty.
    assert 200 <= cases <= 6000, cases
    # Requests got through to storage (with auth on: the token was sent, and no 401 came back).
    # Most generated cases are refused by design (random ids, archives that are not tar), so
    # the share of successes is small; none at all would mean a blocked route or token.
    assert statuses[200] + statuses[201] > cases // 40 and statuses[401] == 0, statuses
    ps.assert_no_errors()
