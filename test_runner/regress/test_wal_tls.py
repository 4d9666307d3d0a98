"""TLS to the primary: a PostgreSQL that takes replication connections over TLS only streams
into the timeline with `sslmode=require` and `verify-full`; a certificate of another CA is
refused, and so is a connection in the clear."""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
from pathlib import Path

import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fixtures.pageserver import Pageserver
from fixtures.postgres import PgEnv
from fixtures.timeline import TimelineHandle
from fixtures.utils import Lsn
from fixtures.wal_stream import primary_with_snapshot, receiver, wait_flushed


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _certificate(subject: str, key, issuer: str, issuer_key, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_certificates(into: Path) -> dict[str, Path]:
    """A CA, a server certificate it signs for 127.0.0.1 (with its key), and another CA."""
    into.mkdir()
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("test CA", ca_key, "test CA", ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate("primary", server_key, "test CA", ca_key, ca=False)
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = _certificate("another CA", other_key, "another CA", other_key, ca=True)
    paths = {name: into / f"{name}.pem" for name in ("ca", "server", "server_key", "other_ca")}
    paths["ca"].write_bytes(_pem(ca))
    paths["other_ca"].write_bytes(_pem(other))
    paths["server"].write_bytes(_pem(server))
    paths["server_key"].write_bytes(
        server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


def test_a_primary_that_takes_tls_only_streams_over_tls(pg: PgEnv, pageserver: Pageserver, timeline: TimelineHandle):
    # The refusals below leave the receiver's log lines.
    pageserver.allowed_errors.append("WAL receiver: ")
    primary = primary_with_snapshot(pg, timeline)
    certs = make_certificates(pg.base / "certs")
    # The server's certificate and key in its data directory, its own (PostgreSQL refuses a
    # key others can read).
    for name in ("server", "server_key"):
        target = primary.datadir / f"{name}.pem"
        shutil.copy(certs[name], target)
        target.chmod(0o600)
        if os.geteuid() == 0:
            shutil.chown(target, "postgres", "postgres")
    primary.psql("ALTER SYSTEM SET ssl = on")
    primary.psql("ALTER SYSTEM SET ssl_cert_file = 'server.pem'")
    primary.psql("ALTER SYSTEM SET ssl_key_file = 'server_key.pem'")
    hba = primary.datadir / "pg_hba.conf"
    hba.write_text(
        "hostssl replication all 127.0.0.1/32 trust\nhostnossl replication all 127.0.0.1/32 reject\n" + hba.read_text()
    )
    primary.psql("SELECT pg_reload_conf()")

    url = f"{timeline.url}/wal_receiver"
    base = f"host=127.0.0.1 port={primary.port} user=postgres"
    # In the clear: the primary's pg_hba.conf turns it away.
    r = requests.put(url, json={"connstr": f"{base} sslmode=disable"}, timeout=60)
    assert r.status_code == 409 and "no encryption" in r.text, r.text
    # A certificate no CA of sslrootcert signed: refused before a byte of the protocol.
    r = requests.put(url, json={"connstr": f"{base} sslmode=verify-full sslrootcert={certs['other_ca']}"}, timeout=60)
    assert r.status_code == 409 and "TLS handshake" in r.text, r.text
    # A CA file that is not there is a setting to fix.
    r = requests.put(url, json={"connstr": f"{base} sslmode=verify-ca sslrootcert={pg.base}/none.pem"}, timeout=60)
    assert r.status_code == 400 and "sslrootcert" in r.text, r.text
    assert receiver(timeline).status_code == 404

    for mode in (f"verify-full sslrootcert={certs['ca']}", "require"):
        r = requests.put(url, json={"connstr": f"{base} sslmode={mode}"}, timeout=60)
        assert r.status_code == 200, (mode, r.text)
        assert r.json()["tls"] is True, r.json()
        primary.psql(f"CREATE TABLE IF NOT EXISTS over_tls (x int); INSERT INTO over_tls SELECT generate_series(1, 1000)")
        lsn = Lsn.parse(primary.psql("SELECT pg_current_wal_insert_lsn()"))
        wait_flushed(timeline, lsn)
        # The primary says so too: its WAL sender to the pageserver is on TLS.
        assert (
            primary.psql(
                "SELECT s.ssl FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid) "
                f"WHERE r.application_name = 'pageserver_{timeline.timeline_id}'"
            )
            == "t"
        )
