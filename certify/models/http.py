"""Image classifiers behind an HTTP inference API, queried as a black box.

Two protocols, chosen by the URL:

- the Open Inference Protocol (KServe v2; Triton, MLServer, KServe):
  ``http://host:port/v2/models/NAME[/versions/V]``. The input's name, datatype and shape come
  from the model metadata (``GET`` on that URL); requests are ``POST …/infer`` with FP32 tensors.
- the TF-Serving / KServe v1 protocol: ``http://host:port/v1/models/NAME[:predict]``, with
  ``{"instances": …}`` in and ``{"predictions": …}`` out. v1 has no input metadata, so the
  image size comes from the suite and the layout from ``HttpOptions.layout`` (NHWC by default,
  TF-Serving's convention).

Retries (connection errors, dropped connections, read timeouts, 5xx and 429 with its
Retry-After) go through urllib3's ``Retry``; a malformed body is retried by the adapter with the
same backoff. When the retries are spent the adapter raises :class:`ModelError` (exit 3), and
the records written so far let ``--resume`` finish the run.

The model's identity is the URL, the declared version and a SHA-256 of its responses to fixed
probe images: certify cannot see the weights behind an endpoint, and the card says so.
The value of the auth header is read from an environment variable and never stored.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import orjson
import requests
import torch
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from certify.device import DeviceChoice
from certify.errors import ModelError, UsageError
from certify.models.base import (
    ModelInfo,
    OutputKind,
    Preprocessing,
    image_layout,
    output_kind,
    probe_images,
    require_finite_probe,
    to_model_input,
)
from certify.redact import redact, register_secret, register_url_secrets

log = logging.getLogger("certify")

_V2 = re.compile(r"^(?P<base>https?://[^?#]*?)/v2/models/(?P<name>[^/?#]+)"
                 r"(?:/versions/(?P<version>[^/?#]+))?(?:/infer)?/?(?P<query>\?[^#]*)?$")
_V1 = re.compile(r"^(?P<base>https?://[^?#]*?)/v1/models/(?P<name>[^/:?#]+)"
                 r"(?:/versions/(?P<version>[^/:?#]+))?(?::predict)?/?(?P<query>\?[^#]*)?$")
_V2_DTYPES = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16, "UINT8": np.uint8}
_V2_NAMES = {np.dtype(v): k for k, v in _V2_DTYPES.items()}
_V2_OUT_DTYPES = {**_V2_DTYPES, "INT64": np.int64, "INT32": np.int32, "INT16": np.int16,
                  "INT8": np.int8, "UINT16": np.uint16, "UINT32": np.uint32,
                  "UINT64": np.uint64, "BOOL": np.bool_}
RETRY_STATUS = (429, 500, 502, 503, 504)


@dataclass(frozen=True)
class HttpOptions:
    """How to talk to an endpoint; every field has a CLI option of the same name.

    ``auth_env`` names the environment variable whose value is sent in ``auth_header``; the
    value itself is never written anywhere. ``batch`` is the number of images per request and
    ``concurrency`` the number of requests in flight at once.
    """

    auth_header: str = "Authorization"
    auth_env: str | None = None
    timeout: float = 30.0
    retries: int = 5
    backoff: float = 0.5
    concurrency: int = 4
    batch: int = 64
    version: str | None = None
    layout: Literal["NCHW", "NHWC"] | None = None
    max_requests: int | None = None

    def describe(self) -> dict[str, Any]:
        """What the card states about the connection (no secret values)."""
        return {
            "timeout_s": self.timeout, "retry_limit": self.retries, "backoff_s": self.backoff,
            "concurrency": self.concurrency, "images_per_request": self.batch,
            "auth_header": self.auth_header if self.auth_env else None,
            "max_requests": self.max_requests,
        }


@dataclass(frozen=True)
class Endpoint:
    """A parsed endpoint URL."""

    protocol: Literal["v2", "v1"]
    base: str
    name: str
    version: str | None
    query: str = ""  # "?…" as given (e.g. a signed URL's parameters), sent with every request

    @property
    def model_url(self) -> str:
        """The URL of the model (metadata for v2, status for v1), without the query."""
        ver = f"/versions/{self.version}" if self.version else ""
        return f"{self.base}/{self.protocol}/models/{self.name}{ver}"

    def url(self, path: str) -> str:
        """A request URL: ``path`` (a full URL without query) plus the given query."""
        return path + self.query

    @property
    def infer_url(self) -> str:
        """The URL inference requests are posted to (with the query)."""
        return self.url(self.model_url + ("/infer" if self.protocol == "v2" else ":predict"))

    @property
    def display(self) -> str:
        """The URL without credentials, query or fragment."""
        return redact(re.sub(r"//[^/@]*@", "//", self.model_url))


def parse_endpoint(url: str) -> Endpoint:
    """Recognise a v2 or v1 model URL, or raise :class:`UsageError` showing both forms."""
    for protocol, rx in (("v2", _V2), ("v1", _V1)):
        m = rx.match(url)
        if m:
            return Endpoint(protocol, m["base"], m["name"], m["version"],  # type: ignore[arg-type]
                            m["query"] or "")
    raise UsageError(
        f"{url} is not a model URL certify understands",
        hint="use http://HOST:PORT/v2/models/NAME (KServe v2 / Triton / MLServer) or "
             "http://HOST:PORT/v1/models/NAME (TF-Serving / KServe v1)",
    )


class _Malformed(Exception):
    """A 2xx response whose body is not what the protocol promises."""


class HttpModel:
    """A classifier behind a KServe v2 or v1 endpoint.

    ``predict(x)`` takes ``[N, C, H, W]`` float32 in ``[0, 1]``, converts it to the model's
    convention (preprocessing and layout, as for ONNX files), splits it into requests of
    ``options.batch`` images sent ``options.concurrency`` at a time, and returns ``[N, K]``
    scores (one-hot rows for a labels-only endpoint) on ``x``'s device.
    """

    feature_name: str | None = None  # no penultimate features behind an API

    def __init__(
        self,
        url: str,
        device: DeviceChoice,
        preprocessing: Preprocessing | None = None,
        input_size: tuple[int, int] | None = None,
        num_classes: int | None = None,
        options: HttpOptions | None = None,
    ) -> None:
        register_url_secrets(url)
        self.endpoint = parse_endpoint(url)
        self.options = options or HttpOptions()
        self.preprocessing = preprocessing or Preprocessing()
        self.device = device
        self._headers = {"Content-Type": "application/json"}
        if self.options.auth_env:
            secret = os.environ.get(self.options.auth_env)
            if not secret:
                raise UsageError(
                    f"environment variable {self.options.auth_env} is not set or empty",
                    hint="export it with the auth header's value, e.g. 'Bearer …'",
                )
            register_secret(secret)  # masked in every message and file from here on
            self._headers[self.options.auth_header] = secret
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=max(1, self.options.concurrency),
                                        thread_name_prefix="certify-http")
        self.requests_sent = 0  # every HTTP request, retries included
        self.retries_sent = 0
        self.images_sent = 0
        self._lock = threading.Lock()

        version = self.options.version or self.endpoint.version
        self.input_name = "input"
        self._dtype: Any = np.float32
        self.binary = False
        if self.endpoint.protocol == "v2":
            self.layout, self.input_shape, meta = self._v2_metadata(input_size)
        else:
            self.layout = self.options.layout or "NHWC"
            if input_size is None:
                raise ModelError(
                    f"{self.endpoint.display} speaks v1, which publishes no input shape",
                    hint="set preprocessing.input_size: [H, W] in the suite",
                )
            self.input_shape = (3, int(input_size[0]), int(input_size[1]))
            meta = {"protocol": "v1 (TF-Serving / KServe v1)"}
        probe = self._forward(to_model_input(probe_images(self.input_shape), self.preprocessing,
                                             self.input_shape[0], self.layout))
        require_finite_probe(probe, self.endpoint.display)
        kind = output_kind(probe)
        k = probe.shape[1] if probe.ndim == 2 else (num_classes or 0)
        if kind == "labels" and not k:
            raise ModelError("the endpoint returns labels but the number of classes is unknown",
                             hint="name the classes in the suite")
        self.num_classes = int(k)
        self.output_kind: OutputKind = kind
        fingerprint = hashlib.sha256(np.ascontiguousarray(probe).tobytes()).hexdigest()
        self.probe_images = len(probe)
        meta["declared_version"] = version or "not declared"
        meta["response_fingerprint"] = f"sha256:{fingerprint}"
        self.info = ModelInfo(
            name=f"{self.endpoint.name} @ {self.endpoint.display}",
            identity=f"{self.endpoint.display}|version={version or '-'}|sha256:{fingerprint}",
            input_shape=self.input_shape,
            num_classes=self.num_classes,
            output=kind,
            layout=self.layout,  # type: ignore[arg-type]
            batch=f"{self.options.batch} images per request, {self.options.concurrency} "
                  "in flight",
            provider=f"HTTP ({self.endpoint.protocol})",
            preprocessing=self.preprocessing,
            metadata=meta,
        )
        log.info("endpoint %s: %s, %d classes, %s", self.endpoint.display,
                 self.endpoint.protocol, self.num_classes, kind)

    # -- transport ------------------------------------------------------------------------
    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            o = self.options
            retry = Retry(total=o.retries, connect=o.retries, read=o.retries, status=o.retries,
                          other=o.retries, backoff_factor=o.backoff, backoff_max=30,
                          status_forcelist=RETRY_STATUS, allowed_methods=None,
                          respect_retry_after_header=True, raise_on_status=False)
            s = requests.Session()
            adapter = HTTPAdapter(max_retries=retry, pool_connections=1, pool_maxsize=1)
            s.mount("http://", adapter)
            s.mount("https://", adapter)
            s.headers.update(self._headers)
            self._local.session = s
        return s

    def _call(self, method: str, url: str, parse: Callable[[requests.Response], Any],
              body: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
        """One request with retries; ``parse`` turns the response into the result."""
        o = self.options
        timeout = (min(o.timeout, 10.0), o.timeout)
        for attempt in range(o.retries + 1):
            self._check_request_cap()
            if attempt:
                with self._lock:
                    self.retries_sent += 1
            try:
                resp = self._session().request(method, url, data=body, headers=headers,
                                               timeout=timeout, allow_redirects=False)
            except requests.RequestException as exc:
                with self._lock:  # the first try and every retry urllib3 made
                    self.requests_sent += 1 + o.retries
                    self.retries_sent += o.retries
                raise ModelError(
                    f"{self.endpoint.display} could not be reached after {o.retries} "
                    f"retries: {_reason(exc)}",
                    hint="check the URL and that the server is up; records are kept, rerun "
                         "with --resume",
                ) from None
            history = getattr(getattr(resp.raw, "retries", None), "history", ()) or ()
            with self._lock:
                self.requests_sent += 1 + len(history)
                self.retries_sent += len(history)
            if resp.status_code in RETRY_STATUS:
                raise ModelError(
                    f"{self.endpoint.display} answered HTTP {resp.status_code} after "
                    f"{o.retries} retries",
                    hint="the server is failing or rate limiting; records are kept, rerun "
                         "with --resume",
                )
            if 300 <= resp.status_code < 400:  # never follow: the secret would go along
                raise ModelError(
                    f"{method} {redact(url)} answered HTTP {resp.status_code}, redirecting to "
                    f"{redact(resp.headers.get('Location', '?'))}; certify does not follow "
                    "redirects", hint="pass the final URL of the endpoint")
            if resp.status_code >= 400:
                raise ModelError(
                    f"{method} {redact(url)} answered HTTP {resp.status_code}: "
                    f"{_snippet(resp.content)}",
                    hint=_status_hint(resp.status_code),
                )
            try:
                return parse(resp)
            except (orjson.JSONDecodeError, _Malformed, KeyError, TypeError, ValueError) as exc:
                if attempt == o.retries:
                    raise ModelError(
                        f"{self.endpoint.display} sent a malformed response "
                        f"{o.retries + 1} times: {_reason(exc)}",
                        hint="check that the server speaks the protocol of the URL; records "
                             "are kept, rerun with --resume",
                    ) from None
                log.debug("malformed response (%s), retrying", _reason(exc))
                time.sleep(o.backoff * (2 ** attempt))
        raise AssertionError("unreachable")

    def _check_request_cap(self) -> None:
        """Refuse a request past ``max_requests`` (retries count; urllib3's retries inside one
        request may pass the cap by at most ``retries``)."""
        cap = self.options.max_requests
        if cap is not None and self.requests_sent >= cap:
            raise ModelError(
                f"{self.endpoint.display}: the request cap of {cap} is reached "
                f"({self.requests_sent} requests sent, {self.retries_sent} of them retries)",
                hint="raise --max-requests; records are kept, rerun with --resume")

    def _v2_metadata(self, input_size: tuple[int, int] | None
                     ) -> tuple[str, tuple[int, int, int], dict[str, str]]:
        meta = self._call("GET", self.endpoint.url(self.endpoint.model_url), _json)
        try:
            inp = meta["inputs"][0]
            name, dtype, dims = str(inp["name"]), str(inp["datatype"]), list(inp["shape"])
        except (KeyError, IndexError, TypeError):
            raise ModelError(
                f"{self.endpoint.display} returned no input description",
                hint="the v2 metadata must list inputs with name, datatype and shape",
            ) from None
        if dtype not in _V2_DTYPES:
            raise ModelError(f"endpoint input {name!r} has datatype {dtype}",
                             hint="certify sends FP32, FP64, FP16 or UINT8 images")
        self.input_name, self._dtype = name, _V2_DTYPES[dtype]
        layout, channels, h, w = image_layout(name, [d if d >= 0 else "?" for d in dims])
        if not isinstance(h, int) or not isinstance(w, int):
            if input_size is None:
                raise ModelError(f"endpoint input {name!r} has a symbolic image size {dims}",
                                 hint="set preprocessing.input_size: [H, W] in the suite")
            h, w = input_size
        try:  # the server's extensions: binary tensors save encoding JSON floats both ways
            server = self._call("GET", self.endpoint.url(f"{self.endpoint.base}/v2"), _json)
            self.binary = "binary_tensor_data" in server.get("extensions", [])
        except ModelError:
            self.binary = False
        info = {"protocol": "v2 (Open Inference Protocol)",
                "encoding": "binary tensor extension" if self.binary else "JSON"}
        if meta.get("platform"):
            info["platform"] = str(meta["platform"])
        if meta.get("versions"):
            info["server_versions"] = ", ".join(map(str, meta["versions"]))
        return layout, (channels, int(h), int(w)), info

    # -- encoding -------------------------------------------------------------------------
    def _request(self, arr: np.ndarray) -> tuple[bytes, dict[str, str] | None]:
        """The body (and extra headers) of one inference request."""
        if self._dtype is np.uint8:
            arr = np.clip(np.rint(arr), 0, 255).astype(np.uint8)
        elif self._dtype is not np.float32:
            arr = arr.astype(self._dtype)
        if self.endpoint.protocol == "v1":
            return orjson.dumps({"instances": arr}, option=orjson.OPT_SERIALIZE_NUMPY), None
        tensor: dict[str, Any] = {"name": self.input_name, "shape": list(arr.shape),
                                  "datatype": _V2_NAMES[np.dtype(arr.dtype)]}
        if not self.binary:
            tensor["data"] = arr.reshape(-1)
            return orjson.dumps({"inputs": [tensor]}, option=orjson.OPT_SERIALIZE_NUMPY), None
        # KServe v2 binary tensor data extension: a JSON header, then the raw little-endian bytes
        raw = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        tensor["parameters"] = {"binary_data_size": len(raw)}
        head = orjson.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}})
        return head + raw, {"Content-Type": "application/octet-stream",
                            "Inference-Header-Content-Length": str(len(head))}

    def _parse(self, n: int) -> Callable[[requests.Response], np.ndarray]:
        def parse(resp: requests.Response) -> np.ndarray:
            if self.endpoint.protocol == "v1":
                preds = _json(resp)["predictions"]
                if preds and isinstance(preds[0], dict):
                    raise _Malformed("predictions are objects, not scores or labels")
                out = np.asarray(preds)
            else:
                out = _v2_output(resp)
            if out.ndim == 2 and out.shape[1] == 1:
                out = out[:, 0]
            if out.shape[:1] != (n,) or out.ndim > 2 or out.dtype == object:
                raise _Malformed(f"expected {n} rows, got shape {list(out.shape)}")
            if out.ndim == 1:
                if not np.all(np.equal(np.mod(out, 1), 0)):
                    raise _Malformed("one value per image that is not a class label")
                return out.astype(np.int64)
            return out.astype(np.float32)
        return parse

    def _post(self, arr: np.ndarray) -> np.ndarray:
        body, headers = self._request(arr)
        out = self._call("POST", self.endpoint.infer_url, self._parse(len(arr)), body, headers)
        with self._lock:
            self.images_sent += len(arr)
        return out

    def _forward(self, arr: np.ndarray) -> np.ndarray:
        if len(arr) == 0:  # nothing to ask the endpoint
            return np.zeros((0, self.num_classes), dtype=np.float32)
        b = max(1, self.options.batch)
        chunks = [arr[i:i + b] for i in range(0, len(arr), b)]
        if len(chunks) == 1:
            return self._post(chunks[0])
        return np.concatenate(list(self._pool.map(self._post, chunks)))

    # -- the one verb ---------------------------------------------------------------------
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Scores ``[N, K]`` for images ``x`` ``[N, C, H, W]`` in ``[0, 1]``."""
        arr = to_model_input(x, self.preprocessing, self.input_shape[0], self.layout)
        out = self._forward(arr)
        if out.ndim == 1:
            if out.min(initial=0) < 0 or out.max(initial=0) >= self.num_classes:
                raise ModelError(
                    f"{self.endpoint.display} returned a label outside 0..{self.num_classes - 1}",
                    hint="check the suite's classes against the served model")
            scores = torch.nn.functional.one_hot(torch.from_numpy(out),
                                                 self.num_classes).float()
        else:
            if out.shape[1] != self.num_classes:
                raise ModelError(
                    f"{self.endpoint.display} returned {out.shape[1]} scores per image, "
                    f"{self.num_classes} at load time", hint="was the served model replaced?")
            scores = torch.from_numpy(out)
        return scores.to(x.device)

    def traffic(self) -> dict[str, Any]:
        """Requests and images sent so far, probes included, for the card."""
        return {"requests": self.requests_sent, "retries": self.retries_sent,
                "images": self.images_sent, "probe_images": self.probe_images,
                **self.options.describe()}

    def close(self) -> None:
        """Stop the request threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _json(resp: requests.Response) -> Any:
    return orjson.loads(resp.content)


def _v2_output(resp: requests.Response) -> np.ndarray:
    """The class scores (or labels) of a v2 response, JSON or with binary tensors."""
    content = resp.content
    head_len = resp.headers.get("Inference-Header-Content-Length")
    head = orjson.loads(content if head_len is None else content[:int(head_len)])
    offset = 0 if head_len is None else int(head_len)
    outputs = []
    for o in head["outputs"]:
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is None:
            arr = np.asarray(o["data"])
        else:
            dtype = np.dtype(_V2_OUT_DTYPES[o["datatype"]]).newbyteorder("<")
            arr = np.frombuffer(content, dtype=dtype, count=int(size) // dtype.itemsize,
                                offset=offset)
            offset += int(size)
        outputs.append(arr.reshape(o["shape"]))
    # the class scores: the first [N, K>1] output, else the first one (labels)
    return next((a for a in outputs if a.ndim == 2 and a.shape[1] > 1), outputs[0])


def _reason(exc: BaseException) -> str:
    """A one-line cause, with any credentials in a URL removed."""
    text = redact((str(exc).splitlines() or [""])[0])[:300]
    return f"{type(exc).__name__}: {text}"


def _snippet(content: bytes) -> str:
    text = redact(content[:200].decode("utf-8", "replace")).strip().replace("\n", " ")
    return text or "(empty body)"


def _status_hint(status: int) -> str:
    return {
        401: "the server wants credentials: --auth-env VAR names the variable holding them",
        403: "the credentials were refused: check the variable named by --auth-env",
        404: "no such model on this server: check NAME (and the version) in the URL",
        400: "the server rejected the input: check the input size, layout and preprocessing",
        413: "the request is too large: lower --http-batch",
        422: "the server rejected the input: check the input size, layout and preprocessing",
    }.get(status, "check the server's logs")
