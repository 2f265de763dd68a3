"""Real model servers on 127.0.0.1 for the HTTP tests and benchmark.

- :class:`OnnxHttpServer`: a threaded ``http.server`` that serves an ONNX model over the KServe v2
  and the v1 (TF-Serving) protocols, with optional bearer auth and seeded injectable faults:
  500s, 429 with Retry-After, slow answers, connections accepted and never answered (hangs),
  truncated JSON, garbage bodies, connections dropped before answering or reset in the middle
  of the body, and an outage (every request 503, health too) after N requests, for ever or for
  a while.
- :func:`mlserver`: MLServer 1.7.1 (its own virtual environment, ``.venv-mlserver``, made by
  scripts/setup.sh because it needs protobuf < 7) serving the same ONNX model through a small
  custom runtime over v2.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
import requests

ROOT = Path(__file__).resolve().parents[1]
MLSERVER = ROOT / ".venv-mlserver" / "bin" / "mlserver"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def hold_until_closed(h: BaseHTTPRequestHandler, stopping: threading.Event) -> None:
    """Answer nothing and keep the connection until the client closes it or the server
    stops (a request accepted but never answered)."""
    h.close_connection = True
    h.connection.settimeout(1.0)
    while not stopping.is_set():
        try:
            if not h.connection.recv(1024):
                break
        except TimeoutError:
            continue
        except OSError:
            break


@dataclass
class Faults:
    """Fault probabilities per inference request (drawn from a seeded generator)."""

    seed: int = 0
    p_500: float = 0.0
    p_429: float = 0.0
    p_slow: float = 0.0
    p_malformed: float = 0.0
    p_drop: float = 0.0
    p_hang: float = 0.0  # accepted, read, never answered (until the client gives up)
    p_reset: float = 0.0  # headers and half the body, then a TCP reset
    p_garbage: float = 0.0  # 200 with bytes that are not the protocol
    slow_s: float = 1.0
    retry_after: int = 1
    outage_after: int | None = None  # every inference request after this many answers 503
    outage_s: float | None = None  # the outage ends this long after it began (None: never)
    first: tuple[str, ...] = ()  # faults for inference requests 2, 3, … before random ones

    #: The kinds, in the order the random draw tests them.
    KINDS = ("500", "429", "slow", "malformed", "drop", "hang", "reset", "garbage")


class OnnxHttpServer:
    """Serves ``model_path`` as ``NAME`` on 127.0.0.1 over v2 and v1 until :meth:`stop`."""

    def __init__(self, model_path: Path, name: str = "signs", token: str | None = None,
                 faults: Faults | None = None, labels_only: bool = False,
                 threads: int = 0, binary: bool = True, query_token: str | None = None,
                 metadata: dict[str, Any] | None = None, noise: float = 0.0) -> None:
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(model_path), opts,
                                            providers=["CPUExecutionProvider"])
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        self.input_shape = [d if isinstance(d, int) else -1 for d in inp.shape]
        self.name = name
        self.token = token
        self.query_token = query_token  # when set, every request needs ?api_key=<it>
        self.metadata = metadata or {}  # overrides of the v2 model metadata (e.g. platform)
        self.faults = faults or Faults()
        self.labels_only = labels_only
        self.noise = noise  # Gaussian noise on every score: a randomised model
        self.noise_rng = np.random.default_rng(self.faults.seed)
        self.binary = binary  # advertise and speak the v2 binary tensor data extension
        self.rng = random.Random(self.faults.seed)
        self.lock = threading.Lock()
        self.infer_requests = 0
        self.images_served = 0  # images the model ran on (answered requests only)
        self.in_flight = 0
        self.max_in_flight = 0  # the most inference requests handled at once
        self.faults_injected: dict[str, int] = {}
        self.outage_began: float | None = None
        self._stopping = threading.Event()
        self.headers_seen: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                server._get(self)

            def do_POST(self) -> None:  # noqa: N802
                server._post(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def v2_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v2/models/{self.name}"

    @property
    def v1_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/models/{self.name}"

    def stop(self) -> None:
        self._stopping.set()  # hung handlers return
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- handlers -------------------------------------------------------------------------
    def _send(self, h: BaseHTTPRequestHandler, status: int, body: bytes,
              headers: dict[str, str] | None = None,
              content_type: str = "application/json") -> None:
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        with contextlib.suppress(OSError):
            h.wfile.write(body)

    def _authorised(self, h: BaseHTTPRequestHandler) -> bool:
        with self.lock:
            self.headers_seen.append(dict(h.headers))
        path, _, query = h.path.partition("?")
        h.path = path  # handlers route on the path alone
        if self.query_token is not None and f"api_key={self.query_token}" not in query.split("&"):
            # like many gateways, echo what was refused (the client must not repeat it)
            self._send(h, 403, json.dumps({"error": f"bad key in {query}"}).encode())
            return False
        if self.token is None or h.headers.get("Authorization") == f"Bearer {self.token}":
            return True
        self._send(h, 401, json.dumps(
            {"error": f"unauthorised: {h.headers.get('Authorization')}"}).encode())
        return False

    def in_outage(self) -> bool:
        """Whether the outage is on now (starting it when its request count is passed)."""
        f = self.faults
        with self.lock:
            if f.outage_after is None or self.infer_requests < f.outage_after:
                return False
            if self.outage_began is None:
                self.outage_began = time.monotonic()
            return f.outage_s is None or time.monotonic() - self.outage_began < f.outage_s

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        if not self._authorised(h):
            return
        if self.in_outage() and h.path.rstrip("/") != "/v2":
            self._send(h, 503, b'{"error": "down"}')
            return
        if h.path.rstrip("/") in ("/v2/health/ready", "/v2/health/live"):
            self._send(h, 200, b"{}")
        elif h.path.rstrip("/") == "/v2":
            ext = ["binary_tensor_data"] if self.binary else []
            self._send(h, 200, json.dumps({"name": "certify-test-server", "version": "1",
                                           "extensions": ext}).encode())
        elif h.path.rstrip("/") == f"/v2/models/{self.name}":
            out = self.session.get_outputs()[0]
            meta = {"name": self.name, "versions": ["1"], "platform": "onnxruntime",
                    "inputs": [{"name": self.input_name, "datatype": "FP32",
                                "shape": self.input_shape}],
                    "outputs": [{"name": out.name, "datatype": "FP32", "shape": [-1, -1]}],
                    **self.metadata}
            self._send(h, 200, json.dumps(meta).encode())
        elif h.path.rstrip("/") == f"/v1/models/{self.name}":
            self._send(h, 200, json.dumps({"model_version_status": [
                {"version": "1", "state": "AVAILABLE"}]}).encode())
        else:
            self._send(h, 404, b'{"error": "not found"}')

    def _fault(self) -> str | None:
        f = self.faults
        out = self.in_outage()
        with self.lock:
            self.infer_requests += 1
            if out:
                kind: str | None = "outage"
            elif 2 <= self.infer_requests < 2 + len(f.first):
                kind = f.first[self.infer_requests - 2]
            else:
                r = self.rng.random()
                kind = None
                for name, p in zip(Faults.KINDS,
                                   (f.p_500, f.p_429, f.p_slow, f.p_malformed, f.p_drop,
                                    f.p_hang, f.p_reset, f.p_garbage), strict=True):
                    if r < p:
                        kind = name
                        break
                    r -= p
            if kind:
                self.faults_injected[kind] = self.faults_injected.get(kind, 0) + 1
        return kind

    def _post(self, h: BaseHTTPRequestHandler) -> None:
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            self._infer(h)
        finally:
            with self.lock:
                self.in_flight -= 1

    def _infer(self, h: BaseHTTPRequestHandler) -> None:
        body = h.rfile.read(int(h.headers.get("Content-Length", 0)))
        if not self._authorised(h):
            return
        path = h.path.rstrip("/")
        if path not in (f"/v2/models/{self.name}/infer", f"/v1/models/{self.name}:predict"):
            self._send(h, 404, b'{"error": "not found"}')
            return
        fault = self._fault()
        if fault == "drop":
            h.close_connection = True
            with contextlib.suppress(OSError):
                h.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault in ("500", "outage"):
            self._send(h, 503 if fault == "outage" else 500, b'{"error": "injected"}')
            return
        if fault == "429":
            self._send(h, 429, b'{"error": "slow down"}',
                       {"Retry-After": str(self.faults.retry_after)})
            return
        if fault == "hang":  # hold the connection until the client closes it
            hold_until_closed(h, self._stopping)
            return
        if fault == "slow":
            time.sleep(self.faults.slow_s)
        if fault == "malformed":
            self._send(h, 200, b'{"outputs": [{"name": "y", "data": [1, 2')
            return
        if fault == "garbage":
            self._send(h, 200, b"\x00\xffnot json <html>502 Bad Gateway</html>")
            return
        if fault == "reset":
            h.close_connection = True
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", "4096")
            h.end_headers()
            with contextlib.suppress(OSError):
                h.wfile.write(b'{"outputs": [{"name": "scores", "data": [0.1, 0.2, ')
                h.wfile.flush()
                h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                        struct.pack("ii", 1, 0))
                h.connection.close()  # with linger 0: a RST in the middle of the body
            return
        head_len = h.headers.get("Inference-Header-Content-Length")
        binary_out = False
        try:
            if head_len is not None:  # binary tensor data extension
                if not self.binary:
                    raise ValueError("binary tensor data is not supported")
                doc = orjson.loads(body[:int(head_len)])
                t = doc["inputs"][0]
                x = np.frombuffer(body, dtype="<f4", offset=int(head_len)).reshape(t["shape"])
                binary_out = bool((doc.get("parameters") or {}).get("binary_data_output"))
            else:
                doc = orjson.loads(body)
                if path.endswith(":predict"):
                    x = np.asarray(doc["instances"], dtype=np.float32)
                else:
                    t = doc["inputs"][0]
                    x = np.asarray(t["data"], dtype=np.float32).reshape(t["shape"])
            y = self.session.run(None, {self.input_name: x})[0]
            with self.lock:
                self.images_served += len(x)
        except Exception as exc:  # noqa: BLE001 - a bad request is the client's 400
            self._send(h, 400, json.dumps({"error": str(exc)[:200]}).encode())
            return
        if self.noise:
            with self.lock:
                y = y + self.noise_rng.normal(0, self.noise, y.shape).astype(y.dtype)
        if self.labels_only:
            y = y.argmax(axis=1)
        if path.endswith(":predict"):
            self._send(h, 200, orjson.dumps({"predictions": y},
                                            option=orjson.OPT_SERIALIZE_NUMPY))
            return
        tensor = {"name": "label" if self.labels_only else "scores", "shape": list(y.shape),
                  "datatype": "INT64" if self.labels_only else "FP32"}
        if binary_out:
            raw = np.ascontiguousarray(y, dtype=y.dtype.newbyteorder("<")).tobytes()
            tensor["parameters"] = {"binary_data_size": len(raw)}
            head = orjson.dumps({"model_name": self.name, "outputs": [tensor]})
            self._send(h, 200, head + raw, {"Inference-Header-Content-Length": str(len(head))},
                       content_type="application/octet-stream")
            return
        tensor["data"] = y.reshape(-1)
        self._send(h, 200, orjson.dumps({"model_name": self.name, "outputs": [tensor]},
                                        option=orjson.OPT_SERIALIZE_NUMPY))


_RUNTIME = '''
import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxRuntime(MLModel):
    async def load(self) -> bool:
        self.session = ort.InferenceSession(self.settings.parameters.uri,
                                            providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name
        extra = self.settings.parameters.extra or {}
        self.batch_log = extra.get("batch_log")
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32)
        y = self.session.run(None, {self.input_name: x})[0]
        if self.batch_log:  # one line per request: how many images it carried
            with open(self.batch_log, "a") as f:
                f.write(f"{len(x)}\\n")
        return InferenceResponse(model_name=self.name,
                                 outputs=[NumpyCodec.encode_output("scores", y)])
'''


@dataclass
class MLServer:
    """A running MLServer: its v2 model URL (REST), its gRPC address (``host:port``), the
    model's name, its process and the file where the runtime logs each request's images."""

    url: str
    grpc: str
    name: str
    proc: subprocess.Popen[bytes]
    batch_log: Path

    def batches(self) -> list[int]:
        """Images per inference request so far, in order (the server's own record)."""
        if not self.batch_log.exists():
            return []
        return [int(v) for v in self.batch_log.read_text().split()]

    def cpu_seconds(self) -> float:
        """CPU seconds the server's process (and its children) used so far."""
        import psutil

        p = psutil.Process(self.proc.pid)
        total = sum(p.cpu_times()[:2])
        for child in p.children(recursive=True):
            try:
                total += sum(child.cpu_times()[:2])
            except psutil.Error:
                continue
        return float(total)


@contextlib.contextmanager
def mlserver_process(model_path: Path, workdir: Path, name: str = "signs",
                     input_shape: tuple[int, ...] = (-1, 3, 32, 32)) -> Iterator[MLServer]:
    """Run MLServer on 127.0.0.1 serving ``model_path`` over REST and gRPC."""
    if not MLSERVER.exists():
        raise RuntimeError(f"{MLSERVER} is missing: run scripts/setup.sh (it builds "
                           ".venv-mlserver)")
    http_port, grpc_port = free_port(), free_port()
    model_dir = workdir / name
    model_dir.mkdir(parents=True)
    batch_log = workdir / "batches.txt"
    (model_dir / "onnx_runtime.py").write_text(_RUNTIME)
    (model_dir / "model-settings.json").write_text(json.dumps({
        "name": name, "implementation": "onnx_runtime.OnnxRuntime",
        "parameters": {"uri": str(model_path), "extra": {"batch_log": str(batch_log)}},
        "inputs": [{"name": "input", "datatype": "FP32", "shape": list(input_shape)}],
    }))
    (workdir / "settings.json").write_text(json.dumps({
        "host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port,
        "metrics_endpoint": None, "parallel_workers": 0, "debug": False,
        "metrics_dir": str(workdir / ".metrics"), "environments_dir": str(workdir / ".envs"),
        "load_models_at_startup": True,
    }))
    log = (workdir / "mlserver.log").open("w")
    proc = subprocess.Popen([str(MLSERVER), "start", str(workdir)], cwd=workdir,
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{http_port}/v2/models/{name}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError("mlserver exited: "
                                   + (workdir / "mlserver.log").read_text()[-2000:])
            try:
                if requests.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("mlserver did not become ready in 60 s")
            time.sleep(0.2)
        yield MLServer(url, f"127.0.0.1:{grpc_port}", name, proc, batch_log)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@contextlib.contextmanager
def mlserver(model_path: Path, workdir: Path, name: str = "signs",
             input_shape: tuple[int, ...] = (-1, 3, 32, 32)) -> Iterator[str]:
    """Run MLServer on 127.0.0.1 serving ``model_path``; yields the v2 model URL."""
    with mlserver_process(model_path, workdir, name, input_shape) as served:
        yield served.url


class Proxy:
    """A threaded HTTP proxy on 127.0.0.1 in front of ``upstream`` (``http://host:port``) that
    adds ``latency_s`` to every round trip (a far-away endpoint) and injects ``faults`` into
    inference requests (``POST …/infer``): 500, 429 with Retry-After, a 200 with garbage, or a
    request accepted and never answered; ``faults.first`` names the faults of the first
    inference requests (``""``: none) before the seeded draws. Counts the requests and faults
    it saw."""

    def __init__(self, upstream: str, latency_s: float = 0.0, faults: Faults | None = None
                 ) -> None:
        self.upstream = upstream.rstrip("/")
        self.latency_s = latency_s
        self.faults = faults or Faults()
        self.rng = random.Random(self.faults.seed)
        self.lock = threading.Lock()
        self.requests = 0
        self.infer_requests = 0
        self.faults_injected: dict[str, int] = {}
        self._local = threading.local()
        self._stopping = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                proxy._forward(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                proxy._forward(self, "POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def url(self, upstream_url: str) -> str:
        """``upstream_url`` (a URL of the upstream server) as reached through this proxy."""
        return self.base + upstream_url[len(self.upstream):]

    def stop(self) -> None:
        self._stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
        return s

    def _fault(self) -> str | None:
        f = self.faults
        with self.lock:
            self.infer_requests += 1
            if self.infer_requests <= len(f.first):  # the first requests' faults, as asked
                kind = f.first[self.infer_requests - 1] or None
                if kind:
                    self.faults_injected[kind] = self.faults_injected.get(kind, 0) + 1
                return kind
            r = self.rng.random()
            for kind, p in (("500", f.p_500), ("429", f.p_429), ("garbage", f.p_garbage),
                            ("hang", f.p_hang)):
                if r < p:
                    self.faults_injected[kind] = self.faults_injected.get(kind, 0) + 1
                    return kind
                r -= p
        return None

    def _send(self, h: BaseHTTPRequestHandler, status: int, body: bytes,
              headers: dict[str, str]) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        with contextlib.suppress(OSError):
            h.wfile.write(body)

    def _forward(self, h: BaseHTTPRequestHandler, method: str) -> None:
        body = h.rfile.read(int(h.headers.get("Content-Length", 0) or 0))
        with self.lock:
            self.requests += 1
        if self.latency_s:
            time.sleep(self.latency_s)
        if method == "POST" and h.path.split("?")[0].rstrip("/").endswith("/infer"):
            fault = self._fault()
            if fault == "500":
                self._send(h, 500, b'{"error": "injected"}', {})
                return
            if fault == "429":
                self._send(h, 429, b'{"error": "slow down"}',
                           {"Retry-After": str(self.faults.retry_after)})
                return
            if fault == "garbage":
                self._send(h, 200, b"\x00\xffnot json <html>502 Bad Gateway</html>",
                           {"Content-Type": "application/json"})
                return
            if fault == "hang":  # accepted, never answered: the client gives up
                hold_until_closed(h, self._stopping)
                return
        keep = ("Content-Type", "Inference-Header-Content-Length", "Authorization")
        headers = {k: v for k, v in h.headers.items() if k in keep}
        try:
            r = self._session().request(method, self.upstream + h.path, data=body or None,
                                        headers=headers, timeout=60)
        except requests.RequestException:
            self._send(h, 502, b'{"error": "upstream"}', {})
            return
        out = {k: v for k, v in r.headers.items()
               if k in ("Content-Type", "Inference-Header-Content-Length", "Retry-After")}
        self._send(h, r.status_code, r.content, out)
