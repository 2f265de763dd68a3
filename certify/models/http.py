"""Image classifiers behind an HTTP inference API, queried as a black box.

Two protocols, chosen by the URL:

- the Open Inference Protocol (KServe v2; Triton, MLServer, KServe):
  ``http://host:port/v2/models/NAME[/versions/V]``. The input's name, datatype and shape come
  from the model metadata (``GET`` on that URL); requests are ``POST …/infer`` with FP32 tensors.
- the TF-Serving / KServe v1 protocol: ``http://host:port/v1/models/NAME[:predict]``, with
  ``{"instances": …}`` in and ``{"predictions": …}`` out. v1 has no input metadata, so the
  image size comes from the suite and the layout from ``HttpOptions.layout`` (NHWC by default,
  TF-Serving's convention).

Every request is retried on connection errors, dropped connections, timeouts, 5xx, 429 (after
its Retry-After) and malformed bodies. Read deadlines come from the observed latency, slow
requests are hedged, and a burst of failures opens a circuit breaker that probes the
endpoint's health (:mod:`certify.models.resilience`). When the endpoint does not recover the
adapter raises :class:`ModelError` (exit 3), and the records written so far let ``--resume``
finish the run.

The model's identity is the URL, the declared version and a SHA-256 of its responses to fixed
probe images: certify cannot see the weights behind an endpoint, and the card says so.
The value of the auth header is read from an environment variable and never stored.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import email.utils
import hashlib
import logging
import os
import queue
import re
import threading
import time
import typing
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import numpy as np
import orjson
import requests

from certify.canonical import JSONLike
from certify.device import DeviceChoice
from certify.errors import ModelError, UsageError
from certify.models.base import (
    Model,
    ModelInfo,
    OutputKind,
    Preprocessing,
    image_layout,
    output_kind,
    probe_images,
    require_finite_probe,
    to_model_input,
)
from certify.models.request_queue import RequestQueue
from certify.models.resilience import (
    BREAKER_CYCLES,
    BURST,
    HEDGE_SHARE,
    OVERLOAD_SHARE,
    OVERLOAD_WINDOW,
    Attempt,
    Breaker,
    Latency,
    TrackedAdapter,
)
from certify.redact import redact, register_secret, register_url_secrets

if TYPE_CHECKING:
    import torch

log = logging.getLogger("certify")

_V2 = re.compile(r"^(?P<base>https?://[^?#]*?)/v2/models/(?P<name>[^/?#]+)"
                 r"(?:/versions/(?P<version>[^/?#]+))?(?:/infer)?/?(?P<query>\?[^#]*)?$")
_V1 = re.compile(r"^(?P<base>https?://[^?#]*?)/v1/models/(?P<name>[^/:?#]+)"
                 r"(?:/versions/(?P<version>[^/:?#]+))?(?::predict)?/?(?P<query>\?[^#]*)?$")
_GRPC = re.compile(r"^(?P<base>grpcs?://[^/?#@]+)/v2/models/(?P<name>[^/?#]+)"
                   r"(?:/versions/(?P<version>[^/?#]+))?/?$")
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
    ``concurrency`` the number of requests in flight at once (hedges aside). ``timeout`` is the
    longest an attempt waits for an answer; after warm-up an attempt's deadline is
    ``deadline_multiplier ×`` the observed p99 for its size, at least ``deadline_floor``.
    ``hedge`` allows duplicate requests for stragglers; ``breaker_wait`` is how long the
    circuit breaker probes a failing endpoint before the run ends.
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
    hedge: bool = True
    breaker_wait: float = 60.0
    deadline_floor: float = 0.25
    deadline_multiplier: float = 4.0

    def describe(self) -> dict[str, Any]:
        """What the card states about the connection (no secret values)."""
        return {
            "timeout_s": self.timeout, "retry_limit": self.retries, "backoff_s": self.backoff,
            "concurrency": self.concurrency, "images_per_request": self.batch,
            "auth_header": self.auth_header if self.auth_env else None,
            "max_requests": self.max_requests, "hedging": self.hedge,
            "breaker_wait_s": self.breaker_wait,
        }


@dataclass(frozen=True)
class Endpoint:
    """A parsed endpoint URL."""

    protocol: Literal["v2", "v1", "grpc"]
    base: str
    name: str
    version: str | None
    query: str = ""  # "?…" as given (e.g. a signed URL's parameters), sent with every request

    @property
    def model_url(self) -> str:
        """The URL of the model (metadata for v2, status for v1), without the query."""
        ver = f"/versions/{self.version}" if self.version else ""
        path = "v1" if self.protocol == "v1" else "v2"  # gRPC URLs name the v2 protocol
        return f"{self.base}/{path}/models/{self.name}{ver}"

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


def parse_grpc_url(url: str) -> tuple[str, str, str | None, bool]:
    """``(host:port, model name, version, tls)`` of a gRPC model URL
    (``grpc[s]://HOST:PORT/v2/models/NAME[/versions/V]``), or a usage error."""
    m = _GRPC.match(url)
    if not m:
        raise UsageError(f"{url} is not a gRPC model URL certify understands",
                         hint="use grpc://HOST:PORT/v2/models/NAME[/versions/V] (grpcs:// for "
                              "TLS)")
    base = m["base"]
    return base.split("://", 1)[1], m["name"], m["version"], base.startswith("grpcs://")


def parse_endpoint(url: str) -> Endpoint:
    """Recognise a v2, v1 or gRPC model URL, or raise :class:`UsageError` showing the forms."""
    if url.startswith(("grpc://", "grpcs://")):
        _target, name, version, _tls = parse_grpc_url(url)
        return Endpoint("grpc", url.split("/v2/models/", 1)[0], name, version)
    for protocol, rx in (("v2", _V2), ("v1", _V1)):
        m = rx.match(url)
        if m:
            return Endpoint(protocol, m["base"], m["name"], m["version"],  # type: ignore[arg-type]
                            m["query"] or "")
    raise UsageError(
        f"{url} is not a model URL certify understands",
        hint="use http://HOST:PORT/v2/models/NAME (KServe v2 / Triton / MLServer), "
             "grpc://HOST:PORT/v2/models/NAME (the same over gRPC) or "
             "http://HOST:PORT/v1/models/NAME (TF-Serving / KServe v1)",
    )


class _Malformed(Exception):
    """A 2xx response whose body is not what the protocol promises."""


@dataclass
class _Outcome:
    """How one attempt ended: ``ok`` (``value``), ``fatal`` (``error``: not retried), or a
    retried failure: ``timeout``, ``conn``, ``overload`` (429/503), ``server_error``,
    ``malformed``."""

    kind: str
    value: Any = None
    latency: float = 0.0
    message: str = ""
    retry_after: float | None = None
    error: ModelError | None = None


#: Retried failures by kind, and the traffic count each one adds to.
_FAILURES = {"timeout": "timeouts", "conn": "connection_errors", "overload": "overloaded",
             "server_error": "server_errors", "malformed": "malformed"}

#: How many answered requests' round trips the latency percentiles are taken over (the last).
ROUND_TRIPS_KEPT = 100_000

#: The longest Retry-After certify honours (seconds); a longer one waits this long.
MAX_RETRY_AFTER = 60.0


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), or ``None``."""
    if not value:
        return None
    try:
        return min(MAX_RETRY_AFTER, max(0.0, float(value)))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return min(MAX_RETRY_AFTER, max(0.0, when.timestamp() - time.time()))


class HttpModel:
    """A classifier behind a KServe v2 or v1 endpoint.

    ``predict(x)`` takes ``[N, C, H, W]`` float32 in ``[0, 1]``, converts it to the model's
    convention (preprocessing and layout, as for ONNX files), splits it into requests of
    ``options.batch`` images sent ``options.concurrency`` at a time, and returns ``[N, K]``
    scores (one-hot rows for a labels-only endpoint) on ``x``'s device.
    """

    feature_name: str | None = None  # no penultimate features behind an API
    #: a local ONNX model whose graph the white-box attacks use (``--surrogate``), or ``None``
    surrogate: Model | None = None

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
        conc = max(1, self.options.concurrency)
        # attempts run here, so that a waiting caller can hedge or abandon them
        self._attempts = ThreadPoolExecutor(max_workers=2 * conc + 2,
                                            thread_name_prefix="certify-attempt")
        self._slots = threading.BoundedSemaphore(conc)  # inference requests in flight
        # every caller's images, packed into requests of --http-batch (one queue per model)
        self._queue = RequestQueue(self._post, self._slots, self.options.batch, conc)
        self._lock = threading.Lock()
        #: requests (every attempt, retries and hedges included), retries, hedges, hedges
        #: that answered first, and failures by kind
        self.counts: dict[str, int] = dict.fromkeys(
            ("requests", "retries", "hedges", "hedge_wins", "hedged_images", "images",
             "health_probes", "inference_requests", "bytes_sent", "bytes_received",
             *_FAILURES.values()), 0)
        #: ``None`` while hedging is allowed, else why not
        self.hedging: str | None = None if self.options.hedge else "--no-hedge"
        self._overloads: collections.deque[bool] = collections.deque(maxlen=OVERLOAD_WINDOW)
        #: seconds of each answered inference request (the latest ones)
        self._round_trips: collections.deque[float] = collections.deque(maxlen=ROUND_TRIPS_KEPT)
        self._answered = False
        self.latency = Latency(self.options.timeout, self.options.deadline_floor,
                               self.options.deadline_multiplier)
        self.breaker = Breaker(self._health, self.options.breaker_wait, parse_endpoint(url)
                               .display)

        version = self.options.version or self.endpoint.version
        self.input_name = "input"
        self._dtype: Any = np.float32
        self.binary = False
        if self.endpoint.protocol != "v1":
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
            provider=("gRPC (Open Inference Protocol)" if self.endpoint.protocol == "grpc"
                      else f"HTTP ({self.endpoint.protocol})"),
            preprocessing=self.preprocessing,
            metadata=meta,
        )
        log.info("endpoint %s: %s, %d classes, %s", self.endpoint.display,
                 self.endpoint.protocol, self.num_classes, kind)

    def with_preprocessing(self, preprocessing: Preprocessing, layout: str | None = None
                           ) -> HttpModel:
        """This endpoint with another input preprocessing, sharing its connections, counts and
        breaker: how :mod:`certify.probe` tries candidates. ``layout`` may change only on a v1
        endpoint given no ``--input-layout`` (v2 metadata states the layout)."""
        other = copy.copy(self)
        other.preprocessing = preprocessing
        info = dataclasses.replace(self.info, preprocessing=preprocessing)
        if layout is not None and layout != self.layout:
            if not self.layout_guessed:
                raise ModelError(f"{self.endpoint.display} takes {self.layout} input, not "
                                 f"{layout}", hint="its metadata or --input-layout says so")
            other.layout = layout
            info = dataclasses.replace(info, layout=layout)  # type: ignore[arg-type]
        other.info = info
        return other

    @property
    def layout_guessed(self) -> bool:
        """Whether the input layout is a guess: a v1 endpoint (no input metadata) given no
        ``--input-layout``."""
        return self.endpoint.protocol == "v1" and self.options.layout is None

    # -- transport ------------------------------------------------------------------------
    def _session(self) -> requests.Session:
        """This thread's session: one keep-alive connection, no automatic retries."""
        s = getattr(self._local, "session", None)
        if s is None:
            s = requests.Session()
            adapter = TrackedAdapter()
            s.mount("http://", adapter)
            s.mount("https://", adapter)
            s.headers.update(self._headers)
            self._local.session = s
        return s

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + n

    def _call(self, method: str, url: str, parse: Callable[[Any], Any],
              body: bytes | None = None, headers: dict[str, str] | None = None,
              images: int = 0, slot_held: bool = False) -> Any:
        """One request with retries; ``parse`` turns the response into the result.

        ``images`` > 0 marks an inference request: its deadline comes from the observed
        latency and it may be hedged; each attempt holds one of ``--concurrency`` request
        slots (``slot_held``: the caller took one for the first attempt, released when that
        attempt ends). Retries: immediately after the first failure, then with exponential
        backoff; a 429 or 503 waits its Retry-After and is never hedged again; a timeout
        retries at once with a doubled deadline. When the retries are spent (or :data:`BURST`
        attempts in a row failed endpoint-wide) the breaker pauses every request and probes
        the endpoint's health: it resumes, or the run ends with exit 3.
        """
        try:
            return self._attempts_of(method, url, parse, body, headers, images, slot_held)
        finally:
            if slot_held and images and not self._held_released():
                self._slots.release()

    def _held_released(self) -> bool:
        """Whether this thread's held request slot was released by an attempt (and forget)."""
        done = bool(getattr(self._local, "held_released", False))
        self._local.held_released = False
        return done

    def _attempts_of(self, method: str, url: str, parse: Callable[[Any], Any],
                     body: bytes | None, headers: dict[str, str] | None, images: int,
                     slot_held: bool) -> Any:
        o = self.options
        failures = timeouts = cycles = attempts = 0
        hedge = images > 0
        held = slot_held and images > 0
        self._local.held_released = False
        while True:
            self.breaker.wait()
            if attempts:  # every attempt after a failed one, a breaker pause's included
                self._count("retries")
            attempts += 1
            deadline = self.latency.deadline(images, timeouts) if images else o.timeout
            # an inference attempt holds one of --concurrency slots; waits between attempts
            # (Retry-After, backoff) hold none, so other requests keep the server busy
            if held:
                gate: contextlib.AbstractContextManager[Any] = _Release(self._slots,
                                                                        self._local)
                held = False
            else:
                gate = self._slots if images else contextlib.nullcontext()
            with gate:
                res = self._race(method, url, body, headers, parse, images, deadline, hedge)
            self._note_overload(res)
            if res.kind == "ok":
                self.breaker.success()
                self._answered = True
                return res.value
            if res.kind == "fatal":
                raise res.error  # type: ignore[misc]
            self._count(_FAILURES[res.kind])
            burst = self.breaker.failure()
            failures += 1
            if res.kind == "overload":
                hedge = False  # never add load to a server that asked for less
            elif res.kind == "timeout":
                timeouts += 1
                self.latency.record_expired(deadline)
            if failures > o.retries or burst:
                why = (f"{failures} attempt(s) in a row failed, the last with {res.message}"
                       if not burst else f"{BURST} attempts in a row failed endpoint-wide, "
                       f"the last with {res.message}")
                if not self._answered:  # never answered: nothing to pause for
                    raise ModelError(f"{self.endpoint.display} could not be reached after "
                                     f"{o.retries} retries: {res.message}",
                                     hint="check the URL and that the server is up; records "
                                          "are kept, rerun with --resume")
                cycles += 1
                if cycles > BREAKER_CYCLES:
                    raise ModelError(
                        f"{self.endpoint.display} reports healthy but the same request failed "
                        f"again after {BREAKER_CYCLES} pauses: {res.message}",
                        hint="the server is failing this request; records are kept, rerun "
                             "with --resume")
                log.warning("%s: %s; pausing all requests to probe its health",
                            self.endpoint.display, why)
                self.breaker.trip(why)
                failures = 0
                continue
            time.sleep(self._backoff(res, failures))

    def _backoff(self, res: _Outcome, failures: int) -> float:
        """Seconds to wait before the next attempt of a request that failed ``failures``
        times: its Retry-After for 429/503, none after a timeout or a first failure, then
        ``backoff × 2^(k-2)`` (at most 30 s)."""
        if res.kind == "overload" and res.retry_after is not None:
            return res.retry_after
        if res.kind == "timeout" or failures <= 1:
            return 0.0
        return min(30.0, float(self.options.backoff * 2 ** (failures - 2)))

    def _note_overload(self, res: _Outcome) -> None:
        """Keep which of the recent answers were 429 or 503 (see :meth:`_overloaded`)."""
        with self._lock:
            self._overloads.append(res.kind == "overload")

    def _overloaded(self) -> bool:
        """Whether 429/503s are at least :data:`OVERLOAD_SHARE` of the last
        :data:`OVERLOAD_WINDOW` answers: then no request is hedged. (A single 429 stops only
        its own request's hedges.) Call with ``_lock`` held."""
        return sum(self._overloads) >= OVERLOAD_SHARE * max(1, len(self._overloads))

    def _reserve(self, hedge: bool) -> bool:
        """Count one more request (and hedge) if it fits: under the request cap, and for a
        hedge with hedging on, the server not overloaded (:meth:`_overloaded`) and under the
        hedge share."""
        cap = self.options.max_requests
        with self._lock:
            sent, hedges = self.counts["requests"], self.counts["hedges"]
            if cap is not None and sent >= cap:
                return False
            if hedge:
                if (self.hedging is not None or self._overloaded()
                        or hedges + 1 > HEDGE_SHARE * sent):
                    return False
                self.counts["hedges"] += 1
            self.counts["requests"] += 1
            return True

    def disable_hedging(self, why: str) -> None:
        """Send no more hedges in this run (e.g. the model answers randomly)."""
        if self.hedging is None:
            log.info("%s: hedging off: %s", self.endpoint.display, why)
            self.hedging = why

    def _launch(self, method: str, url: str, body: bytes | None,
                headers: dict[str, str] | None, parse: Callable[[requests.Response], Any],
                deadline: float, hedge: bool, finished: queue.SimpleQueue[Attempt]
                ) -> Attempt:
        att = Attempt(hedge=hedge)

        def run() -> None:
            try:
                att.finish(self._attempt(att, method, url, body, headers, parse, deadline))
            except BaseException as exc:  # noqa: BLE001 - reported to the waiting caller
                att.finish(_Outcome("conn", message=_reason(exc)))
            finished.put(att)

        self._attempts.submit(run)
        return att

    def _race(self, method: str, url: str, body: bytes | None,
              headers: dict[str, str] | None, parse: Callable[[requests.Response], Any],
              images: int, deadline: float, hedge: bool) -> _Outcome:
        """Send one attempt, a hedge if it has not answered by the observed p95, and return
        the first valid answer (the other attempt is aborted), or the failure."""
        if not self._reserve(hedge=False):
            self._refuse_past_cap()
        finished: queue.SimpleQueue[Attempt] = queue.SimpleQueue()
        attempts = [self._launch(method, url, body, headers, parse, deadline, False, finished)]
        # an attempt ends by itself within its deadline (plus connecting); this is a backstop
        limit = time.monotonic() + deadline + min(self.options.timeout, 10.0) + 5.0
        hedge_at = self.latency.hedge_delay(images, deadline) if hedge else None
        outcomes: list[Attempt] = []
        while len(outcomes) < len(attempts):
            wait = limit - time.monotonic()
            if hedge_at is not None and len(attempts) == 1:
                wait = min(wait, attempts[0].started + hedge_at - time.monotonic())
            try:
                att = finished.get(timeout=max(0.0, wait))
            except queue.Empty:
                if hedge_at is not None and len(attempts) == 1 and time.monotonic() < limit:
                    if self._reserve(hedge=True):
                        self._count("hedged_images", images)
                        attempts.append(self._launch(method, url, body, headers, parse,
                                                     deadline, True, finished))
                    hedge_at = None
                    continue
                for a in attempts:
                    a.abort()
                return _Outcome("timeout", message=f"no answer in {deadline:.3g} s")
            outcomes.append(att)
            res: _Outcome = att.outcome
            if res.kind == "ok":
                for other in attempts:
                    if other is not att:
                        other.abort()
                if att.hedge:
                    self._count("hedge_wins")
                if images:
                    self.latency.observe(res.latency, images)
                    with self._lock:
                        self._round_trips.append(res.latency)
                return res
        # every attempt failed: a 429/503 decides the wait, else the first attempt's failure
        results = [a.outcome for a in outcomes]
        for kind in ("fatal", "overload"):
            for r in results:
                if r.kind == kind:
                    return typing.cast(_Outcome, r)
        return typing.cast(_Outcome, attempts[0].outcome)

    def _attempt(self, att: Attempt, method: str, url: str, body: bytes | None,
                 headers: dict[str, str] | None, parse: Callable[[requests.Response], Any],
                 deadline: float) -> _Outcome:
        """One HTTP attempt on this transport thread, classified."""
        if not att.begin_io():
            return _Outcome("conn", message="aborted")
        t0 = time.monotonic()
        try:
            resp = self._session().request(method, url, data=body, headers=headers,
                                           timeout=(min(self.options.timeout, 10.0), deadline),
                                           allow_redirects=False)
        except requests.Timeout:
            return _Outcome("timeout", message=f"no answer in {deadline:.3g} s")
        except requests.RequestException as exc:
            if att.aborted:
                return _Outcome("conn", message="aborted")
            return _Outcome("conn", message=_reason(exc))
        finally:
            att.end_io()
        latency = time.monotonic() - t0
        self._count("bytes_sent", len(body or b""))
        self._count("bytes_received", len(resp.content))
        status = resp.status_code
        if status in (429, 503):
            return _Outcome("overload", message=f"HTTP {status}",
                            retry_after=_retry_after(resp.headers.get("Retry-After")))
        if status in RETRY_STATUS:
            return _Outcome("server_error", message=f"HTTP {status}")
        if 300 <= status < 400:  # never follow: the secret would go along
            return _Outcome("fatal", error=ModelError(
                f"{method} {redact(url)} answered HTTP {status}, redirecting to "
                f"{redact(resp.headers.get('Location', '?'))}; certify does not follow "
                "redirects", hint="pass the final URL of the endpoint"))
        if status >= 400:
            return _Outcome("fatal", error=ModelError(
                f"{method} {redact(url)} answered HTTP {status}: {_snippet(resp.content)}",
                hint=_status_hint(status)))
        try:
            return _Outcome("ok", value=parse(resp), latency=latency)
        except (orjson.JSONDecodeError, _Malformed, KeyError, TypeError, ValueError,
                IndexError) as exc:
            log.debug("malformed response (%s)", _reason(exc))
            return _Outcome("malformed", message=f"a malformed response: {_reason(exc)}")

    def _health(self) -> str | None:
        """``None`` when the endpoint says it is ready, else why not (the breaker's probe):
        v2 ``/v2/health/ready`` (the model metadata where that route is missing), v1 the
        model's status."""
        e = self.endpoint
        urls = ([e.url(f"{e.base}/v2/health/ready"), e.url(e.model_url)]
                if e.protocol == "v2" else [e.url(e.model_url)])
        self._count("health_probes")
        why = ""
        for u in urls:
            try:
                r = self._session().get(u, timeout=(min(self.options.timeout, 10.0),
                                                    min(self.options.timeout, 5.0)),
                                        allow_redirects=False)
            except requests.RequestException as exc:
                return _reason(exc)
            if r.status_code == 200:
                return None
            why = f"GET {redact(u)}: HTTP {r.status_code}"
            if r.status_code != 404:
                break
        return why

    def _refuse_past_cap(self) -> NoReturn:
        """Refuse a request past ``max_requests`` (retries and hedges count)."""
        cap = self.options.max_requests
        raise ModelError(
            f"{self.endpoint.display}: the request cap of {cap} is reached "
            f"({self.counts['requests']} requests sent, {self.counts['retries']} of them "
            f"retries, {self.counts['hedges']} hedges)",
            hint="raise --max-requests; records are kept, rerun with --resume")

    def _v2_metadata(self, input_size: tuple[int, int] | None
                     ) -> tuple[str, tuple[int, int, int], dict[str, str]]:
        """The input's layout and shape, and what the card states about the protocol, from
        the model's v2 metadata (:meth:`_fetch_metadata`)."""
        meta, info = self._fetch_metadata()
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
        if meta.get("platform"):
            info["platform"] = str(meta["platform"])
        if meta.get("versions"):
            info["server_versions"] = ", ".join(map(str, meta["versions"]))
        return layout, (channels, int(h), int(w)), info

    def _fetch_metadata(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The model's v2 metadata (a JSON document), and the protocol and encoding in words;
        notes whether the server speaks the binary tensor extension."""
        meta = self._call("GET", self.endpoint.url(self.endpoint.model_url), _json)
        if not isinstance(meta, dict):
            raise ModelError(f"{self.endpoint.display} returned metadata that is not an object",
                             hint="the v2 metadata must list inputs with name, datatype and "
                                  "shape")
        try:  # the server's extensions: binary tensors save encoding JSON floats both ways
            server = self._call("GET", self.endpoint.url(f"{self.endpoint.base}/v2"), _json)
            self.binary = "binary_tensor_data" in server.get("extensions", [])
        except ModelError:
            self.binary = False
        return meta, {"protocol": "v2 (Open Inference Protocol)",
                      "encoding": "binary tensor extension" if self.binary else "JSON"}

    # -- encoding -------------------------------------------------------------------------
    def _typed(self, arr: np.ndarray) -> np.ndarray:
        """``arr`` in the datatype the endpoint takes."""
        if self._dtype is np.uint8:
            return np.clip(np.rint(arr), 0, 255).astype(np.uint8)
        if self._dtype is not np.float32:
            return arr.astype(self._dtype)
        return arr

    def _request(self, arr: np.ndarray) -> tuple[bytes, dict[str, str] | None]:
        """The body (and extra headers) of one inference request."""
        arr = self._typed(arr)
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

    def _outputs(self, resp: Any) -> np.ndarray:
        """The class scores (or labels) an answer holds, as the protocol encodes them."""
        if self.endpoint.protocol == "v1":
            preds = _json(resp)["predictions"]
            if preds and isinstance(preds[0], dict):
                raise _Malformed("predictions are objects, not scores or labels")
            return np.asarray(preds)
        return _v2_output(resp)

    def _parse(self, n: int) -> Callable[[Any], np.ndarray]:
        def parse(resp: Any) -> np.ndarray:
            out = self._outputs(resp)
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

    def _post(self, arr: np.ndarray, slot_held: bool = False) -> np.ndarray:
        """One packed request of ``arr`` (at most ``--http-batch`` images), with retries."""
        body, headers = self._request(arr)
        out = self._call("POST", self.endpoint.infer_url, self._parse(len(arr)), body, headers,
                         images=len(arr), slot_held=slot_held)
        self._count("images", len(arr))
        self._count("inference_requests")
        return typing.cast(np.ndarray, out)

    def _forward(self, arr: np.ndarray) -> np.ndarray:
        """The endpoint's rows for ``arr``, through the model's one request queue."""
        if len(arr) == 0:  # nothing to ask the endpoint
            return np.zeros((0, self.num_classes), dtype=np.float32)
        return self._queue.submit(arr)

    def lane(self) -> contextlib.AbstractContextManager[None]:
        """Register an engine lane for the duration of a batch: the request queue sends a
        request early once every registered lane waits for an answer
        (:mod:`certify.models.request_queue`)."""
        return self._queue.lane()

    # -- the one verb ---------------------------------------------------------------------
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Scores ``[N, K]`` for images ``x`` ``[N, C, H, W]`` in ``[0, 1]``."""
        import torch

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

    def traffic(self) -> dict[str, JSONLike]:
        """Requests, retries, hedges, failures, images and bytes so far (probes included),
        images per answered request, the round trips' latency percentiles, the deadlines
        chosen and the breaker's record, for the card."""
        with self._lock:
            counts = dict(self.counts)
            trips = sorted(self._round_trips)
        b = self.breaker
        answered = counts.get("inference_requests", 0)

        def pct(q: float) -> float | None:
            return None if not trips else round(1000 * trips[min(len(trips) - 1,
                                                                 int(q * len(trips)))], 3)

        return {**counts, "probe_images": self.probe_images,
                "images_per_answered_request": (round(counts["images"] / answered, 2)
                                                if answered else None),
                "round_trip_ms": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99),
                                  "max": pct(1.0), "count": len(trips)},
                "protocol": self.endpoint.protocol,
                "hedging_off": self.hedging,
                "breaker": {"trips": b.trips, "paused_s": round(b.paused_s, 3)},
                "deadlines": self.latency.describe(), **self.options.describe()}

    def close(self) -> None:
        """Stop the request threads."""
        self._queue.close()
        self._attempts.shutdown(wait=False, cancel_futures=True)


class _Release:
    """A request slot the caller already holds, released when the attempt it gates ends (and
    noted in ``local``, so that :meth:`HttpModel._call` does not release it twice)."""

    def __init__(self, slots: threading.Semaphore, local: threading.local) -> None:
        self.slots, self.local = slots, local

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.slots.release()
        self.local.held_released = True


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
