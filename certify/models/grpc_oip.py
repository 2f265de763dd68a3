"""The Open Inference Protocol over gRPC (KServe's ``grpc_predict_v2``; Triton, MLServer and
KServe serve it): ``grpc://host:port/v2/models/NAME[/versions/V]`` (``grpcs://`` for TLS).

Tensors travel as raw little-endian bytes (``raw_input_contents``, and the answer's
``raw_output_contents`` or typed ``contents``), not as JSON numbers. The message types are
built here from the protocol's field numbers (a descriptor made at import, in a pool of our
own), so certify needs ``grpcio`` alone (the ``grpc`` extra) and neither generated stubs nor a
protobuf version pinned by a serving SDK: ``tritonclient[grpc]`` pins protobuf < 7. Messages
keep only the fields certify reads or writes; a server's other fields are skipped on parsing,
as protobuf does with any field it does not know.

:class:`GrpcModel` is :class:`~certify.models.http.HttpModel` with this transport: the same
request queue, retries, deadlines, hedges and circuit breaker, with gRPC status codes mapped
onto the same outcomes (``DEADLINE_EXCEEDED`` a timeout, ``UNAVAILABLE`` a connection failure,
``RESOURCE_EXHAUSTED`` an overload, ``INTERNAL``/``UNKNOWN``/``ABORTED`` a server error; the
request's own faults, ``INVALID_ARGUMENT``, ``NOT_FOUND``, ``UNAUTHENTICATED``,
``PERMISSION_DENIED``, ``UNIMPLEMENTED``, end the run with exit 3 and the reason).
"""

from __future__ import annotations

import functools
import time
import typing
from collections.abc import Callable
from typing import Any

import numpy as np

from certify.errors import ModelError, UsageError
from certify.models.http import HttpModel, _Malformed, _Outcome, parse_grpc_url

#: The service every method of the protocol belongs to.
SERVICE = "/inference.GRPCInferenceService/"
#: The largest answer accepted (bytes); requests may be as large as the batch makes them.
MAX_RECEIVE_BYTES = 256 * 2**20


# name -> [(field name, number, type, label, message type name or None)]
_T = {"bool": 8, "int64": 3, "int32": 5, "uint32": 13, "uint64": 4, "float": 2,
      "double": 1, "bytes": 12, "string": 9, "message": 11}
_MESSAGES: dict[str, list[tuple[str, int, str, str, str | None]]] = {
    "ServerReadyRequest": [],
    "ServerReadyResponse": [("ready", 1, "bool", "optional", None)],
    "ModelReadyRequest": [("name", 1, "string", "optional", None),
                          ("version", 2, "string", "optional", None)],
    "ModelReadyResponse": [("ready", 1, "bool", "optional", None)],
    "ServerMetadataRequest": [],
    "ServerMetadataResponse": [("name", 1, "string", "optional", None),
                               ("version", 2, "string", "optional", None),
                               ("extensions", 3, "string", "repeated", None)],
    "ModelMetadataRequest": [("name", 1, "string", "optional", None),
                             ("version", 2, "string", "optional", None)],
    "TensorMetadata": [("name", 1, "string", "optional", None),
                       ("datatype", 2, "string", "optional", None),
                       ("shape", 3, "int64", "repeated", None)],
    "ModelMetadataResponse": [("name", 1, "string", "optional", None),
                              ("versions", 2, "string", "repeated", None),
                              ("platform", 3, "string", "optional", None),
                              ("inputs", 4, "message", "repeated", "TensorMetadata"),
                              ("outputs", 5, "message", "repeated", "TensorMetadata")],
    "InferTensorContents": [("bool_contents", 1, "bool", "repeated", None),
                            ("int_contents", 2, "int32", "repeated", None),
                            ("int64_contents", 3, "int64", "repeated", None),
                            ("uint_contents", 4, "uint32", "repeated", None),
                            ("uint64_contents", 5, "uint64", "repeated", None),
                            ("fp32_contents", 6, "float", "repeated", None),
                            ("fp64_contents", 7, "double", "repeated", None)],
    "InferInputTensor": [("name", 1, "string", "optional", None),
                         ("datatype", 2, "string", "optional", None),
                         ("shape", 3, "int64", "repeated", None)],
    "ModelInferRequest": [("model_name", 1, "string", "optional", None),
                          ("model_version", 2, "string", "optional", None),
                          ("inputs", 5, "message", "repeated", "InferInputTensor"),
                          ("raw_input_contents", 7, "bytes", "repeated", None)],
    "InferOutputTensor": [("name", 1, "string", "optional", None),
                          ("datatype", 2, "string", "optional", None),
                          ("shape", 3, "int64", "repeated", None),
                          ("contents", 5, "message", "optional", "InferTensorContents")],
    "ModelInferResponse": [("model_name", 1, "string", "optional", None),
                           ("outputs", 5, "message", "repeated", "InferOutputTensor"),
                           ("raw_output_contents", 6, "bytes", "repeated", None)],
}
_CONTENTS = {"FP32": "fp32_contents", "FP64": "fp64_contents", "INT64": "int64_contents",
             "INT32": "int_contents", "INT16": "int_contents", "INT8": "int_contents",
             "UINT32": "uint_contents", "UINT16": "uint_contents", "UINT8": "uint_contents",
             "UINT64": "uint64_contents", "BOOL": "bool_contents"}
_RAW = {"FP32": "<f4", "FP64": "<f8", "FP16": "<f2", "INT64": "<i8", "INT32": "<i4",
        "INT16": "<i2", "INT8": "i1", "UINT64": "<u8", "UINT32": "<u4", "UINT16": "<u2",
        "UINT8": "u1", "BOOL": "?"}


@functools.cache
def messages() -> dict[str, Any]:
    """The protocol's message classes (those certify uses), by name."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FileDescriptorProto(name="certify/grpc_predict_v2.proto",
                                           package="inference", syntax="proto3")
    for name, fields in _MESSAGES.items():
        m = f.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            fd = m.field.add(name=fname, number=number, type=_T[ftype],
                             label=3 if label == "repeated" else 1)
            if type_name is not None:
                fd.type_name = f".inference.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return {name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"inference.{name}")) for name in _MESSAGES}


def encode_infer(model: str, version: str | None, input_name: str, arr: np.ndarray) -> bytes:
    """A ModelInferRequest of one input tensor ``arr``, as raw little-endian bytes."""
    m = messages()
    dtype = next(k for k, v in _RAW.items() if np.dtype(v) == arr.dtype.newbyteorder("<")
                 or np.dtype(v) == arr.dtype)
    req = m["ModelInferRequest"](model_name=model, model_version=version or "")
    req.inputs.add(name=input_name, datatype=dtype, shape=list(arr.shape))
    req.raw_input_contents.append(np.ascontiguousarray(arr, dtype=np.dtype(_RAW[dtype]))
                                  .tobytes())
    return bytes(req.SerializeToString())


def decode_outputs(data: bytes) -> list[np.ndarray]:
    """The output tensors of a ModelInferResponse, raw or typed; ``ValueError`` for one that
    does not hold what its datatype and shape say."""
    resp = messages()["ModelInferResponse"].FromString(data)
    out = []
    for k, t in enumerate(resp.outputs):
        shape = [int(d) for d in t.shape]
        if t.datatype not in _RAW:
            raise ValueError(f"output datatype {t.datatype!r}")
        if k < len(resp.raw_output_contents):
            arr = np.frombuffer(resp.raw_output_contents[k], dtype=np.dtype(_RAW[t.datatype]))
        else:
            arr = np.asarray(getattr(t.contents, _CONTENTS.get(t.datatype, "fp32_contents")))
        if arr.size != int(np.prod(shape)):
            raise ValueError(f"output {t.name!r} holds {arr.size} values, shape {shape}")
        out.append(arr.reshape(shape))
    if not out:
        raise ValueError("no outputs")
    return out


class Channel:
    """A gRPC channel to one server, whose unary calls take and give serialized bytes."""

    def __init__(self, target: str, tls: bool) -> None:
        try:
            import grpc
        except ImportError:
            raise UsageError("gRPC endpoints need grpcio, which certify installs with its grpc "
                             "extra", hint="pip install 'certify[grpc]'") from None
        self.grpc = grpc
        opts = [("grpc.max_send_message_length", -1),
                ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
                ("grpc.enable_retries", 0)]  # certify retries, counts and hedges itself
        self.channel = (grpc.secure_channel(target, grpc.ssl_channel_credentials(), opts)
                        if tls else grpc.insecure_channel(target, opts))
        self._methods: dict[str, Any] = {}

    def method(self, name: str) -> Any:
        """The unary method ``name`` of the inference service."""
        if name not in self._methods:
            self._methods[name] = self.channel.unary_unary(SERVICE + name)
        return self._methods[name]

    def call(self, name: str, body: bytes, timeout: float,
             metadata: tuple[tuple[str, str], ...], on_future: Callable[[Any], None]
             ) -> tuple[str, bytes | None, str]:
        """One call: ``(status name, answer bytes or None, details)``; ``on_future`` gets the
        call's future first (to cancel it from another thread)."""
        fut = self.method(name).future(body, timeout=timeout, metadata=metadata)
        on_future(fut)
        try:
            data = fut.result()
        except self.grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else ""
            return (code.name if code is not None else "UNKNOWN"), None, str(details or "")
        except self.grpc.FutureCancelledError:
            return "CANCELLED", None, "aborted"
        return "OK", typing.cast(bytes, data), ""

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()


#: gRPC status codes, by what certify does with them (others: a server error, retried).
TIMEOUT = frozenset({"DEADLINE_EXCEEDED"})
CONNECTION = frozenset({"UNAVAILABLE", "CANCELLED"})
OVERLOAD = frozenset({"RESOURCE_EXHAUSTED"})
FATAL = {"INVALID_ARGUMENT": "the server rejected the input: check the input size, layout and "
                             "preprocessing",
         "NOT_FOUND": "no such model on this server: check NAME (and the version) in the URL",
         "UNAUTHENTICATED": "the server wants credentials: --auth-env VAR names the variable "
                            "holding them (sent as gRPC metadata under --auth-header, lower "
                            "case)",
         "PERMISSION_DENIED": "the credentials were refused: check the variable named by "
                              "--auth-env",
         "UNIMPLEMENTED": "the server does not speak the Open Inference Protocol over gRPC",
         "FAILED_PRECONDITION": "the server is not ready for this model",
         "OUT_OF_RANGE": "the server rejected the input: check the input size"}


class GrpcModel(HttpModel):
    """A classifier behind the Open Inference Protocol's gRPC binding: :class:`HttpModel`'s
    queue, retries, deadlines, hedges and breaker over gRPC calls with raw tensor bytes.
    ``options.auth_env``'s value goes as the call metadata ``options.auth_header`` (lower
    case, as gRPC requires)."""

    def __init__(self, url: str, *args: Any, **kwargs: Any) -> None:
        target, self._model_name, self._model_version, tls = parse_grpc_url(url)
        self._channel = Channel(target, tls)
        try:
            super().__init__(url, *args, **kwargs)
        except BaseException:
            self._channel.close()
            raise

    @property
    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return tuple((k.lower(), v) for k, v in self._headers.items()
                     if k.lower() != "content-type")

    def _unary(self, name: str, request: Any, parse: Callable[[bytes], Any]) -> Any:
        """A metadata call (``name``) with retries, as HTTP's GETs."""
        return self._call("RPC", name, parse, request.SerializeToString())

    def _fetch_metadata(self) -> tuple[dict[str, Any], dict[str, str]]:
        m = messages()
        meta = self._unary("ModelMetadata", m["ModelMetadataRequest"](
            name=self._model_name, version=self._model_version or ""),
            m["ModelMetadataResponse"].FromString)
        doc = {"inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                          for t in meta.inputs],
               "platform": meta.platform, "versions": list(meta.versions)}
        self.binary = True  # raw tensor contents both ways
        return doc, {"protocol": "v2 (Open Inference Protocol) over gRPC",
                     "encoding": "raw tensor bytes"}

    def _request(self, arr: np.ndarray) -> tuple[bytes, dict[str, str] | None]:
        return encode_infer(self._model_name, self._model_version, self.input_name,
                            self._typed(arr)), None

    def _outputs(self, resp: Any) -> np.ndarray:
        try:
            outputs = decode_outputs(typing.cast(bytes, resp))
        except ValueError as exc:
            raise _Malformed(str(exc)) from None
        # the class scores: the first [N, K>1] output, else the first one (labels)
        return next((a for a in outputs if a.ndim == 2 and a.shape[1] > 1), outputs[0])

    def _attempt(self, att: Any, method: str, url: str, body: bytes | None,
                 headers: dict[str, str] | None, parse: Callable[[Any], Any],
                 deadline: float) -> _Outcome:
        """One gRPC call on this transport thread, classified as an HTTP attempt is."""
        rpc = "ModelInfer" if method == "POST" else url
        if not att.begin_io():
            return _Outcome("conn", message="aborted")
        t0 = time.monotonic()
        try:
            status, data, details = self._channel.call(
                rpc, body or b"", deadline, self._metadata,
                lambda fut: att.on_abort(fut.cancel))
        finally:
            att.end_io()
        latency = time.monotonic() - t0
        self._count("bytes_sent", len(body or b""))
        self._count("bytes_received", len(data or b""))
        said = f"gRPC {status}" + (f": {details[:200]}" if details else "")
        if status == "OK":
            try:
                return _Outcome("ok", value=parse(data), latency=latency)
            except Exception as exc:  # noqa: BLE001 - a malformed answer, retried
                return _Outcome("malformed", message=f"a malformed response: "
                                                     f"{type(exc).__name__}: {exc}"[:300])
        if att.aborted:
            return _Outcome("conn", message="aborted")
        if status in TIMEOUT:
            return _Outcome("timeout", message=f"no answer in {deadline:.3g} s")
        if status in CONNECTION:
            return _Outcome("conn", message=said)
        if status in OVERLOAD:
            return _Outcome("overload", message=said)
        if status in FATAL:
            return _Outcome("fatal", error=ModelError(
                f"{self.endpoint.display}: {rpc} answered {said}", hint=FATAL[status]))
        return _Outcome("server_error", message=said)

    def _health(self) -> str | None:
        """``None`` when the server and the model say they are ready, else why not."""
        m = messages()
        self._count("health_probes")
        wait = min(self.options.timeout, 5.0)
        for name, request in (("ServerReady", m["ServerReadyRequest"]()),
                              ("ModelReady", m["ModelReadyRequest"](
                                  name=self._model_name, version=self._model_version or ""))):
            status, data, details = self._channel.call(
                name, request.SerializeToString(), wait, self._metadata, lambda fut: None)
            if status != "OK":
                return f"{name}: gRPC {status}" + (f": {details[:200]}" if details else "")
            answer = m[f"{name}Response"].FromString(data or b"")
            if not answer.ready:
                return f"{name}: not ready"
        return None

    def close(self) -> None:
        """Stop the request threads and close the channel."""
        super().close()
        self._channel.close()
