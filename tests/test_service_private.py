"""Issue 60 point 5: the service's home, its database, run folders and job logs are the service
user's only (folders 0700, files 0600), for a new home and for an existing one at start.

A running run's folder and job log are checked where a run is caught computing
(``test_service_jobhost.py``'s job-host kill test).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from service_fixture import Service

from builders import run_cli

pytestmark = pytest.mark.e2e


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


def _open_to_others(root: Path) -> list[str]:
    """Every path under ``root`` (itself included) that a group or other user may access."""
    return [str(p) for p in (root, *root.rglob("*"))
            if not p.is_symlink() and _mode(p) & 0o077]


@pytest.fixture
def loose_umask():
    """The umask most systems give a user (022), whatever this test process had."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.unit
def test_secure_home_makes_a_new_home_private_and_tightens_an_existing_one(
        tmp_path: Path, loose_umask: None, caplog: pytest.LogCaptureFixture) -> None:
    from certify.service.private import secure_home

    new = tmp_path / "a" / "home"
    assert secure_home(new) == 0
    assert _mode(new) == 0o700 and _mode(new.parent) == 0o700

    old = tmp_path / "old"
    (old / "store" / "runs" / "r1").mkdir(parents=True)
    (old / "state.db").write_bytes(b"")
    (old / "store" / "runs" / "r1" / "card.html").write_text("x")
    os.chmod(old / "store" / "runs" / "r1" / "card.html", 0o755)
    (old / "link").symlink_to("/etc/hostname")  # never followed, never changed
    before = _mode(Path("/etc/hostname"))
    with caplog.at_level(logging.WARNING, logger="certify.service"):
        assert secure_home(old) == 6  # old, store, runs, r1, state.db, card.html
    assert _open_to_others(old) == []
    assert _mode(old / "store" / "runs" / "r1" / "card.html") == 0o700 & 0o600
    assert _mode(Path("/etc/hostname")) == before
    assert any("tightened 6 files and folders" in r.getMessage() for r in caplog.records)
    caplog.clear()
    assert secure_home(old) == 0 and not caplog.records  # nothing to say the second time


@pytest.mark.slow
def test_a_new_and_an_existing_home_are_private_after_start(tmp_path: Path,
                                                            loose_umask: None) -> None:
    """``serve token create`` makes a new home (0700, state.db 0600); a home left readable
    by an older certify is tightened when ``certify serve`` starts, and says so."""
    home = tmp_path / "home"
    made = run_cli("serve", "token", "create", "--home", home, "--role", "submit")
    assert made.returncode == 0, made.stderr
    assert _mode(home) == 0o700 and _mode(home / "state.db") == 0o600
    assert _open_to_others(home) == []

    # as an older certify left it: everything readable by every local user
    for p in (home, *home.rglob("*")):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    (home / "store" / "runs" / "r").mkdir(parents=True)
    (home / "store" / "runs" / "r" / "job.log").write_text("old")
    os.chmod(home / "store" / "runs", 0o755)
    svc = Service(home, "--workers", "0").start()
    try:
        assert _open_to_others(home) == [], svc.log()
        assert "to the service user's only" in svc.log()
        # what the running service creates (the store, keys, the database's journal) too
        assert (home / "store").is_dir() and (home / "keys").is_dir()
    finally:
        svc.stop()
    assert _open_to_others(home) == []
