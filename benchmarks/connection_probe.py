"""What idle, slow and anonymous clients can hold of ``certify serve`` (issue 38, item 3).

Starts a real ``certify serve`` (``--workers 0``, its deadlines at their defaults: headers within
10 s, bodies at 64 KB/s after 5 s of grace, 32 connections per client address) on 127.0.0.1 with
a temporary folder of its own (TMPDIR), and tries the issue's attacks:

* uploads without a token: ``--uploads`` clients each announce ``--upload-mb`` MB to
  ``POST /api/v1/runs`` and push the body as fast as the server takes it until its answer
  comes; reported: the bytes the clients got to send, the time to the answer, the most the
  server held meanwhile in files open under its temporary folder (TMPDIR) and its store;
* ``--idle`` sockets that send nothing, ``--slow-headers`` connections that send a request's
  headers a byte a second, ``--slow-bodies`` authenticated submissions whose body arrives at
  1 KB/s: how many the server still holds open as time passes. These clients are spread over
  10 loopback addresses (127.0.0.2-11) so the per-address limit does not hide the deadlines;
  the same idle sockets from one address then show that limit;
* ``/api/v1/health`` latency while the slow connections are held.

Run: ``.venv/bin/python benchmarks/connection_probe.py`` (about a minute). The same script
measures a server without the deadlines (an older checkout) when its ``certify`` is first on the
path: ``PYTHONPATH=/path/to/old/checkout .venv/bin/python benchmarks/connection_probe.py``.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from service_fixture import Service  # noqa: E402

SOURCES = [f"127.0.0.{i}" for i in range(2, 12)]
PART = b'--xyz\r\nContent-Disposition: form-data; name="model"; filename="m.onnx"\r\n\r\n'


def _connect(svc: Service, source: str) -> socket.socket | None:
    s = socket.socket()
    try:
        s.bind((source, 0))
        s.connect(("127.0.0.1", svc.port))
    except OSError:
        s.close()
        return None
    return s


def _head(path: str, length: int, token: str | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: certify", f"Content-Length: {length}",
             "Content-Type: multipart/form-data; boundary=xyz"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _open(socks: list[socket.socket]) -> list[socket.socket]:
    """The sockets the server has not closed (what it sent is read and dropped)."""
    alive = []
    for s in socks:
        if s.fileno() < 0:
            continue
        s.setblocking(False)
        try:
            while s.recv(65536):
                pass
        except BlockingIOError:
            alive.append(s)  # nothing more to read, and no end: still open
        except OSError:
            pass
        finally:
            s.setblocking(True)
    return alive


def _spooled_bytes(pid: int, *folders: Path) -> int:
    """Bytes of the files process ``pid`` holds open under ``folders`` (an upload spooled to
    disk is an unnamed file, O_TMPFILE, that no listing of the folder shows)."""
    total = 0
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir() if fds.is_dir() else ():
        try:
            target = os.readlink(fd)
            if any(target.startswith(str(f)) for f in folders):
                total += fd.stat().st_size
        except OSError:
            pass
    return total


def anonymous_uploads(svc: Service, spool: Path, n: int, mb: int) -> dict[str, float]:
    """``n`` clients at once announce ``mb`` MB each without a token and push the body."""
    length = mb * 2**20
    sent, waits, statuses = [0] * n, [0.0] * n, [""] * n
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            assert svc.proc is not None
            peak[0] = max(peak[0], _spooled_bytes(svc.proc.pid, spool, svc.home / "store"))
            time.sleep(0.02)

    def client(i: int) -> None:
        # sends until the answer comes (read as soon as it is readable) or the body is sent
        s = socket.create_connection(("127.0.0.1", svc.port))
        start = time.monotonic()
        chunk = b"\0" * 2**20
        try:
            s.sendall(_head("/api/v1/runs", length) + PART)  # a model file's part
            sent[i] = len(PART)
            while sent[i] < length:
                readable, writable, _ = select.select([s], [s], [], 60)
                if readable:
                    break
                if writable:
                    sent[i] += s.send(chunk[: length - sent[i]])
        except OSError:
            pass
        try:
            s.settimeout(60)
            statuses[i] = s.recv(64).split(b"\r\n")[0].decode(errors="replace")
        except OSError as exc:
            statuses[i] = type(exc).__name__
        waits[i] = time.monotonic() - start
        s.close()

    sampler = threading.Thread(target=sample)
    sampler.start()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    sampler.join()
    return {"clients": n, "announced_mb": mb, "sent_mb_total": sum(sent) / 2**20,
            "answer_s_max": max(waits), "peak_tmp_mb": peak[0] / 2**20,
            "statuses": sorted(set(statuses))}  # type: ignore[dict-item]


def held_over_time(label: str, socks: list[socket.socket], at: list[float],
                   feed: object = None) -> dict[str, object]:
    """How many of ``socks`` stay open at each of the times ``at`` (seconds from now);
    ``feed(socks)`` is called every second to send what slow clients send."""
    start, out, fed = time.monotonic(), {}, 0
    for t in at:
        while time.monotonic() - start < t:
            if feed is not None and time.monotonic() - start >= fed:
                feed(_open(socks))  # type: ignore[operator]
                fed += 1
            time.sleep(0.05)
        out[f"open_at_{t:g}s"] = len(_open(socks))
    print(f"{label}: {len(socks)} opened; {out}", flush=True)
    for s in socks:
        s.close()
    return {"opened": len(socks), **out}


def _send_each(data: bytes):  # type: ignore[no-untyped-def]
    def feed(socks: list[socket.socket]) -> None:
        for s in socks:
            try:
                s.send(data)
            except OSError:
                pass
    return feed


def health_p99(svc: Service, n: int = 50) -> float:
    ms = []
    for _ in range(n):
        t = time.monotonic()
        requests.get(f"{svc.url}/api/v1/health", timeout=30)
        ms.append((time.monotonic() - t) * 1000)
    return float(np.percentile(ms, 99))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--uploads", type=int, default=8)
    ap.add_argument("--upload-mb", type=int, default=450)
    ap.add_argument("--idle", type=int, default=300)
    ap.add_argument("--slow-headers", type=int, default=300)
    ap.add_argument("--slow-bodies", type=int, default=200)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        spool = root / "spool"
        spool.mkdir()
        svc = Service(root / "home", "--workers", "0")
        os.environ["TMPDIR"] = str(spool)  # the server's spooled uploads land here
        try:
            svc.start()
        finally:
            os.environ.pop("TMPDIR")
        try:
            token = svc.token("submit")
            print("uploads without a token:",
                  anonymous_uploads(svc, spool, args.uploads, args.upload_mb), flush=True)

            def spread(n: int) -> list[socket.socket]:
                socks = [_connect(svc, SOURCES[i % len(SOURCES)]) for i in range(n)]
                return [s for s in socks if s is not None]

            held_over_time(f"idle ({len(SOURCES)} addresses)", spread(args.idle),
                           [1, 12, 20])
            one = [s for s in (_connect(svc, "127.0.0.12") for _ in range(args.idle)) if s]
            held_over_time("idle (one address)", one, [1, 12])

            slow = spread(args.slow_headers)
            for s in slow:
                s.send(b"GET /api/v1/health HTTP/1.1\r\nHost: certify\r\n")
            p99 = []
            t = threading.Thread(target=lambda: p99.append(health_p99(svc)))
            t.start()
            held_over_time(f"slow headers, 1 byte/s ({len(SOURCES)} addresses)", slow,
                           [5, 12, 20], _send_each(b"x"))
            t.join()
            print(f"/health p99 while slow headers are held: {p99[0]:.1f} ms", flush=True)

            bodies = spread(args.slow_bodies)
            for s in bodies:  # the start of a file part: the service waits for the rest
                s.send(_head("/api/v1/runs", 10 * 2**20, token) + PART)
            held_over_time(f"slow bodies, 1 KB/s, with a token ({len(SOURCES)} addresses)",
                           bodies, [3, 8, 12, 20], _send_each(b"x" * 1024))
            print(f"/health p99 afterwards: {health_p99(svc):.1f} ms", flush=True)
        finally:
            svc.stop()


if __name__ == "__main__":
    main()
