"""A real ``certify serve`` process on 127.0.0.1 for the service tests, and what they submit."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import requests

from builders import run_cli, write_small_suite

CERTIFY = str(Path(sys.executable).with_name("certify"))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """``certify serve`` in a subprocess, with its own home folder and log file."""

    def __init__(self, home: Path, *args: str, db: str | None = None,
                 env: dict[str, str] | None = None, command: str = "serve") -> None:
        self.home, self.args, self.db = home, list(args), db
        #: added to this process's environment; ``command``: ``serve``, or ``worker`` (no
        #: HTTP: :meth:`start` waits for its first heartbeat line instead)
        self.env, self.command = dict(env or {}), command
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = home.parent / f"{home.name}-{command}.log"

    def _db_args(self) -> list[str]:
        return ["--db", self.db] if self.db else []

    def start(self, timeout: float = 60.0) -> Service:
        """Start the server and wait until its health endpoint answers."""
        return self.launch().wait_up(timeout)

    def launch(self) -> Service:
        """Start the server's process without waiting for it (then :meth:`wait_up`)."""
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        logf = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [CERTIFY, self.command, "--home", str(self.home), "--port", str(self.port),
             *self._db_args(), *self.args],
            stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **self.env})
        logf.close()
        return self

    def wait_up(self, timeout: float = 60.0) -> Service:
        """Wait until the launched server answers its health endpoint (a worker: until its
        first heartbeat line); a RuntimeError with its log if it exits or takes too long."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"certify {self.command} exited {self.proc.returncode}:\n"
                                   f"{self.log()}")
            if self.command == "worker":
                if "slot(s), device" in self.log():
                    return self
            else:
                try:
                    if requests.get(f"{self.url}/api/v1/health", timeout=2).ok:
                        return self
                except requests.RequestException:
                    pass
            time.sleep(0.2)
        raise RuntimeError(f"certify serve did not come up in {timeout} s:\n{self.log()}")

    def log(self) -> str:
        """Everything the server printed."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def token(self, role: str = "submit", *extra: str) -> str:
        """A new API token (through the CLI, as an operator makes one).

        On SQLite the command runs in this process (a new interpreter per token cost a second
        or more); on a server database in a subprocess, whose exit closes the connection the
        command leaves in its pool.
        """
        args = ("serve", "token", "create", "--home", str(self.home), *self._db_args(),
                "--role", role, *extra)
        if self.db is None:
            done = run_cli(*args, env=self.env)
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout.strip()
        out = subprocess.run([CERTIFY, *args], capture_output=True, text=True, check=True,
                             env={**os.environ, **self.env})
        return out.stdout.strip()

    def kill(self) -> None:
        """SIGKILL the server (only the server process, as a crash would)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        """Stop the server gracefully (SIGTERM), or kill it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def get(self, path: str, token: str | None = None, **kw: Any) -> requests.Response:
        """GET under /api/v1."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return requests.get(f"{self.url}/api/v1{path}", headers=headers, timeout=30, **kw)

    def post(self, path: str, token: str | None = None, **kw: Any) -> requests.Response:
        """POST under /api/v1."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return requests.post(f"{self.url}/api/v1{path}", headers=headers, timeout=60, **kw)

    def session_delete(self, path: str, token: str) -> requests.Response:
        """DELETE under /api/v1."""
        return requests.delete(f"{self.url}/api/v1{path}",
                               headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def wait_run(self, run_id: str, token: str, timeout: float = 300.0,
                 states: tuple[str, ...] = ("done", "error", "cancelled")) -> dict[str, Any]:
        """Poll a run until it reaches one of ``states``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.get(f"/runs/{run_id}", token)
            r.raise_for_status()
            doc = r.json()
            if doc["state"] in states:
                return doc
            time.sleep(0.3)
        raise AssertionError(f"run {run_id} not {states} after {timeout} s:\n{self.log()}")


def post_run(svc: Service, token: str, suite: Path, **data: str) -> requests.Response:
    """POST /runs of the demo model with an uploaded suite on the registered 'small' data."""
    from certify.api import demo_model_path

    with demo_model_path().open("rb") as m, suite.open("rb") as s:
        return svc.post("/runs", token, files={"model": ("standard.onnx", m),
                                               "suite_file": ("small.yaml", s)},
                        data={"dataset": "small", **data})


def submit_cli(svc: Service, token: str, suite: Path, out: Path, samples: int,
               *extra: str) -> subprocess.CompletedProcess[str]:
    """``certify submit`` of the demo model, following the run and downloading its card."""
    from certify.api import demo_model_path

    return subprocess.run([CERTIFY, "submit", str(demo_model_path()), "--server", svc.url,
                           "--suite", str(suite), "--dataset", "small", "--samples",
                           str(samples), "--out", str(out), *extra], capture_output=True,
                          text=True, timeout=300, env={
                              **os.environ, "CERTIFY_TOKEN": token,
                              "CERTIFY_LOG_STATE": str(out.parent / f".{out.name}-log.json")})


def job_processes(home: Path, run_id: str = "") -> list[int]:
    """Pids of job processes of this service home (and run) still alive: the children that
    its job hosts forked (their stdout is a run's ``job.log`` under the home), or a
    ``python -m certify.service.job`` started on its own."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        try:
            out = os.readlink(d / "fd" / "1")
        except OSError:
            out = ""
        forked = (out.startswith(f"{home}/") and out.endswith("/job.log")
                  and f"/{run_id}" in out)
        if forked or (b"certify.service.job" in cmd and any(
                str(home).encode() in c and run_id.encode() in c for c in cmd)):
            pids.append(int(d.name))
    return pids


def slow_attack_suite(folder: Path) -> Path:
    """A suite whose run lasts long enough to be interrupted (Square L∞, 2,000 queries)."""
    return write_small_suite(folder / "slow.yaml", "slow", [
        {"id": "square", "kind": "attack", "params": {
            "attack": "square_linf", "epsilon": 0.03, "max_queries": 2000,
            "binarization": False}}])


def small_inputs(folder: Path, per_class: int = 2) -> tuple[Path, Path]:
    """A small suite (clean + noise) and an .npz of demo data for it."""
    from certify.demo.synthetic import generate

    folder.mkdir(parents=True, exist_ok=True)
    suite = write_small_suite(folder / "small.yaml", "small")
    x, y = generate(per_class, seed=11)
    data = folder / "small.npz"
    np.savez(data, x=x, y=y)
    return suite, data


class InProcess:
    """``certify serve`` (no workers) on 127.0.0.1 in a thread of this process."""

    def __init__(self, home: Path, **cfg: object) -> None:
        import uvicorn

        from certify.service.app import create_app
        from certify.service.config import ServeConfig

        self.app = create_app(ServeConfig(home=home, workers=0, **cfg),  # type: ignore[arg-type]
                              start_workers=False)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0,
                                                    log_level="warning", lifespan="on",
                                                    proxy_headers=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def token(self, role: str = "read") -> str:
        from certify.service import auth

        svc = self.app.state.services
        with svc.factory() as s:
            plain, _ = auth.create_token(s, "t", role, None)
        return plain

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
