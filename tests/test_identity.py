"""Issue 39 item 3: the service's keys come from configuration and every node must hold the
same ones (recorded by fingerprint in the database); one configuration (a --config file) for
`certify serve` and `certify worker`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from certify.errors import UsageError
from certify.report.sign import fingerprint, keygen
from certify.service.db import Identity, make_engine, migrate, sessions, sqlite_url
from certify.service.identity import load_identity

import builders as b

pytestmark = pytest.mark.unit


@pytest.fixture()
def factory(tmp_path: Path):
    engine = make_engine(sqlite_url(tmp_path))
    migrate(engine)
    yield sessions(engine)
    engine.dispose()


def test_nodes_must_share_the_recorded_keys(tmp_path: Path, factory, monkeypatch) -> None:
    key, _ = keygen(tmp_path / "k1", "service")
    other, _ = keygen(tmp_path / "k2", "other")
    secret = tmp_path / "session.secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    first = load_identity(factory, tmp_path / "node-a", key, None, secret, None)
    # a second node (its own home) with the same keys agrees, and gets the same certificate
    (tmp_path / "k1" / "service.crt").unlink()  # e.g. only the key was mounted there
    second = load_identity(factory, tmp_path / "node-b", key, None, secret, None)
    assert second.certificate_pem == first.certificate_pem
    assert second.session_secret == first.session_secret
    with factory() as s:
        recorded = s.get(Identity, "sign_key").value
    assert recorded == fingerprint(first.private.public_key())
    # another signing key, another session secret: refused, naming what to share
    with pytest.raises(UsageError, match="signing key .* is not the service's") as exc:
        load_identity(factory, tmp_path / "node-c", other, None, secret, None)
    assert "--sign-key" in (exc.value.hint or "")
    with pytest.raises(UsageError, match="session secret"):
        load_identity(factory, tmp_path / "node-c", key, None, None, None)  # its home's own
    with pytest.raises(UsageError, match="secrets key"):
        load_identity(factory, tmp_path / "node-a", key, None, secret, "sha256:" + "0" * 64)
        load_identity(factory, tmp_path / "node-a", key, None, secret, "sha256:" + "1" * 64)
    # a node without the secrets key the service has cannot read the runs' endpoint secrets
    with pytest.raises(UsageError, match="secrets key .* this node was not given"):
        load_identity(factory, tmp_path / "node-a", key, None, secret, None)
    # a node that made its own certificate for the same key takes the service's
    from certify.report.pades import write_certificate

    own = tmp_path / "k3"
    own.mkdir()
    (own / "service.key").write_bytes(key.read_bytes())
    (own / "service.key").chmod(0o600)
    write_certificate(first.private, own / "service.crt")
    assert (own / "service.crt").read_bytes() != first.certificate_pem
    third = load_identity(factory, tmp_path / "node-f", own / "service.key", None, secret,
                          "sha256:" + "0" * 64)
    assert third.certificate_pem == first.certificate_pem
    assert (own / "service.crt").read_bytes() == first.certificate_pem
    # the same key from the environment (PEM text), and the session secret as hex
    monkeypatch.setenv("CERTIFY_SIGN_KEY", key.read_text())
    monkeypatch.setenv("CERTIFY_SESSION_SECRET", secret.read_bytes().hex())
    env_node = load_identity(factory, tmp_path / "node-d", None, None, None,
                             "sha256:" + "0" * 64)
    assert env_node.sign_key.stat().st_mode & 0o077 == 0
    assert env_node.certificate_pem == first.certificate_pem
    # a deliberate key change: --new-identity
    rotated = load_identity(factory, tmp_path / "node-e", other, None, secret,
                            "sha256:" + "0" * 64, rotate=True)
    with factory() as s:
        assert s.get(Identity, "sign_key").value == fingerprint(rotated.private.public_key())
        cert = s.get(Identity, "certificate").value.encode()
    assert cert == rotated.certificate_pem


def test_one_config_file_for_serve_and_worker(tmp_path: Path) -> None:
    cfg = tmp_path / "certify.yaml"
    cfg.write_text(f"home: {tmp_path / 'h'}\nworkers: 0\nstore: {tmp_path / 'st'}\n")
    r = b.run_cli("worker", "--config", cfg)
    assert r.returncode == 2 and "--workers 1 or more" in r.stderr  # read: workers is 0
    r = b.run_cli("worker", "--config", cfg, "--workers", "1", "--lease", "1",
                  "--heartbeat", "2")  # the command line wins over the file
    assert r.returncode == 2 and "--heartbeat 2.0 must be shorter" in r.stderr
    cfg.write_text("home: x\nbogus-option: 1\n")
    r = b.run_cli("serve", "--config", cfg)
    assert r.returncode == 2 and "unknown option 'bogus-option'" in r.stderr
    assert "sign-key" in r.stderr
    cfg.write_text("new-identity: true\n")  # would switch the refusal off on every node
    r = b.run_cli("worker", "--config", cfg)
    assert r.returncode == 2 and "command-line flag only" in r.stderr
    cfg.write_text("- a list\n")
    r = b.run_cli("worker", "--config", cfg)
    assert r.returncode == 2 and "mapping" in r.stderr


@pytest.mark.unit
def test_a_raw_session_secret_is_taken_whole(tmp_path: Path) -> None:
    """32 random bytes that begin and end with bytes Python calls white space (a 1-in-20
    draw of os.urandom(32)) were stripped to 30 and refused as "shorter than 32 bytes"; a
    longer secret lost its ends silently. Raw bytes are taken whole; hex text may end in a
    newline."""
    from certify.service.identity import _session_secret

    secret = tmp_path / "session.secret"
    raw = b"\n\t" + bytes(range(100, 128)) + b" \r"
    secret.write_bytes(raw)
    secret.chmod(0o600)
    assert _session_secret(tmp_path / "home", secret) == raw
    secret.write_text(raw.hex() + "\n")
    assert _session_secret(tmp_path / "home", secret) == raw
