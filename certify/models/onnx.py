"""ONNX classifiers on onnxruntime.

The adapter owns the model's input convention: layout (NCHW or NHWC, read off the input shape),
value scale, mean/std, channel order, input dtype and a batch dimension fixed in the graph. A
batch dimension fixed to 1 is made symbolic only where :mod:`certify.models.batching` proves
that every image keeps its own answer (ONNX shape inference through per-sample operations) and
images answer the same alone and in batches of different make-up; otherwise the graph runs at
its fixed batch: onnxruntime in chunks, the torch copy mapped over single images.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import typing
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from certify.data.classes import metadata_class_names
from certify.device import DeviceChoice, usable_cpus
from certify.errors import ModelError
from certify.models import batching, torchcopy
from certify.models.base import (
    WHITE_BOX,
    ModelInfo,
    OutputKind,
    Preprocessing,
    image_layout,
    output_kind,
    probe_images,
    require_finite_probe,
    to_model_input,
)
from certify.onnx_files import (  # noqa: F401 - re-exported: the model's files
    external_data_files,
    external_data_locations,
    graph_tensors,
    model_identity,
    sha256_file,
)

if typing.TYPE_CHECKING:
    import onnxruntime as ort

log = logging.getLogger("certify")

_ORT_DTYPES: dict[str, Any] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(uint8)": np.uint8,
}
#: Most images per onnxruntime call on the CPU provider (dynamic-batch models). On 2 cores the
#: demo model runs a HopSkipJump attack 6% faster in calls of 256 than in whole probe sets of
#: thousands (benchmarks/RESULTS.md, issue 17); outputs are the same per image.
CPU_CHUNK = 256
#: Microseconds an onnxruntime pool thread spins for more work after a call before it sleeps
#: (its default held a core for milliseconds). On 2 cores, 500: calls of 4 images 1 ms apart
#: cost 114 µs against 84 with the default (within 3% of the loop's time); 50-300 µs apart as
#: the default; without any spinning after a call (``session.force_spinning_stop``) small
#: back-to-back calls cost 13-42% more (benchmarks/RESULTS.md, issue 66).
SPIN_US = 500
#: A caller's own size for those calls, within :func:`cpu_call_size` (this thread only).
_CALL_SIZE: ContextVar[int | None] = ContextVar("certify_onnx_call_size", default=None)
_SILENCED = False


@contextlib.contextmanager
def cpu_call_size(images: int) -> Iterator[None]:
    """Within the block (this thread or task only), a dynamic-batch model on the CPU provider
    gets onnxruntime calls of at most ``images`` images instead of :data:`CPU_CHUNK`; outputs
    are the same per image. For a caller that measured the size that suits the model (the
    brittle score: certify/checks/brittleness.py). Other providers and fixed batches are as
    without it."""
    if images < 1:
        raise ValueError(f"a call carries at least one image, not {images}")
    token = _CALL_SIZE.set(images)
    try:
        yield
    finally:
        _CALL_SIZE.reset(token)


def _ort() -> Any:
    """onnxruntime, imported at the first session rather than with this module: its import
    starts a thread, and a process that forks (the service's job hosts,
    :mod:`certify.service.jobhost`) imports this module but must not hold threads."""
    import onnxruntime

    return onnxruntime


def _silence_ort() -> None:
    """Keep onnxruntime's own logging to errors that matter (warnings go to our log line)."""
    global _SILENCED
    if not _SILENCED:
        _ort().set_default_logger_severity(3)
        _SILENCED = True


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    dims: list[int | str] = []
    for d in value_info.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or "?")
    return dims


def _penultimate(proto: onnx.ModelProto) -> str | None:
    """The tensor that feeds the last linear layer (Gemm or MatMul with constant weights).

    Graph nodes are stored in topological order, so the last such node is the classifier
    head, whatever follows it (softmax, argmax, one-hot ...).
    """
    consts = {i.name for i in proto.graph.initializer}
    consts |= {o for n in proto.graph.node if n.op_type == "Constant" for o in n.output}
    for node in reversed(proto.graph.node):
        if node.op_type in ("Gemm", "MatMul"):
            data = [i for i in node.input[:2] if i not in consts]
            if len(data) == 1 and len(node.input) >= 2:
                return typing.cast("str | None", data[0])
    return None


class OnnxModel:
    """An ONNX image classifier run by onnxruntime.

    ``predict(x)`` takes ``[N, C, H, W]`` float32 in ``[0, 1]`` (RGB) and returns ``[N, K]``
    float32 scores on ``x``'s device. Every call is one forward pass per chunk of the model's
    batch size.
    """

    def __init__(
        self,
        path: str | Path,
        device: DeviceChoice,
        preprocessing: Preprocessing | None = None,
        input_size: tuple[int, int] | None = None,
        num_classes: int | None = None,
        threads: int = 0,
    ) -> None:
        _silence_ort()
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelError(f"model file not found: {self.path}", hint="check the MODEL path")
        self.preprocessing = preprocessing or Preprocessing()
        identity = model_identity(self.path)
        try:
            proto = onnx.load(str(self.path))
        except Exception as exc:  # noqa: BLE001 - any parse failure means a corrupt file
            raise ModelError(
                f"{self.path} is not a readable ONNX model ({type(exc).__name__})",
                hint="re-export the model, and check the file was not truncated",
            ) from exc
        initializers = {i.name for i in proto.graph.initializer}
        inputs = [i for i in proto.graph.input if i.name not in initializers]
        if len(inputs) != 1:
            raise ModelError(
                f"model has {len(inputs)} inputs ({', '.join(i.name for i in inputs)})",
                hint="certify needs an image classifier with exactly one image input",
            )
        if not proto.graph.output:
            raise ModelError("model has no outputs", hint="re-export the model")
        inp = inputs[0]
        dims = _dims(inp)
        layout, channels, height, width = image_layout(inp.name, dims)
        if not isinstance(height, int) or not isinstance(width, int):
            if input_size is None:
                raise ModelError(
                    f"model input {inp.name!r} has a symbolic image size {dims}",
                    hint="set preprocessing.input_size: [H, W] in the suite",
                )
            height, width = input_size
        #: the graph as run: the file's, or its rewrite where a batch of 1 was proven symbolic
        #: (one copy of the weights is held: a rewrite taken back reloads the file)
        self._proto = proto
        self._white_box_refusal = torchcopy.refusal(proto)
        self._torch_copy: torchcopy.TorchCopy | None = None
        self._torch_device = device.torch_device
        self._feature_session: ort.InferenceSession | None = None
        self.feature_name: str | None = _penultimate(proto)
        self.layout = layout
        self.input_name = inp.name
        self.output_name = proto.graph.output[0].name
        elem = onnx.helper.tensor_dtype_to_string(inp.type.tensor_type.elem_type)
        self._np_dtype = {
            "TensorProto.FLOAT": np.float32,
            "TensorProto.FLOAT16": np.float16,
            "TensorProto.DOUBLE": np.float64,
            "TensorProto.UINT8": np.uint8,
        }.get(elem)
        if self._np_dtype is None:
            raise ModelError(
                f"model input {inp.name!r} has element type {elem}",
                hint="certify feeds float32, float16, float64 or uint8 images",
            )
        self._sess_options = _ort().SessionOptions()
        self._sess_options.log_severity_level = 3
        # A pool's threads spin for at most SPIN_US after a call before they sleep: a caller
        # that calls again sooner (an attack's next step) finds them awake, and certify's own
        # work between calls (the brittle score's masked images, built on every core) gets
        # the cores after that. onnxruntime's own spinning held the second of 2 cores for
        # milliseconds after each call, which made building on two threads no faster than on
        # one (benchmarks/RESULTS.md, issue 66).
        self._sess_options.add_session_config_entry("session.intra_op.spin_duration_us",
                                                    str(SPIN_US))
        if threads:
            self._sess_options.intra_op_num_threads = threads
        self._providers = list(device.ort_providers)
        self._cpu_chunk = 0  # set once the session's provider is known

        fixed_batch = dims[0] if isinstance(dims[0], int) else None
        self.fixed_batch: int | None = fixed_batch
        self.batch_mode = "dynamic"
        #: how the batch was decided and checked, in a sentence (``None``: the graph's own)
        self.batching_note: str | None = None
        self.session = self._session(str(self.path))
        self._fixed_session = self.session
        self.input_shape = (channels, int(height), int(width))
        if fixed_batch == 1:
            self._try_symbolic_batch(proto)
        elif fixed_batch is not None:
            self.batch_mode = f"fixed {fixed_batch} (chunked)"
            self.batching_note = (f"written for batches of {fixed_batch} and run in chunks "
                                  "of that size (the last one padded)")

        provider = self.session.get_providers()[0]
        self._cpu_chunk = CPU_CHUNK if provider == "CPUExecutionProvider" else 0
        if "CUDAExecutionProvider" in self._providers and provider != "CUDAExecutionProvider":
            log.info("onnxruntime: CUDA provider could not load; running on the CPU")
        probe = self._probe_outputs()
        output = output_kind(probe)
        meta = {p.key: p.value for p in proto.metadata_props}
        named = metadata_class_names(meta)
        k = probe.shape[1] if probe.ndim == 2 else (num_classes or (len(named[0]) if named
                                                                     else 0))
        if output == "labels" and not k:
            raise ModelError(
                "model returns labels but the number of classes is unknown",
                hint="name the classes: --labels FILE, classes in the suite, or a 'labels' "
                     "entry in the model's metadata",
            )
        self.num_classes = int(k)
        self.output_kind: OutputKind = output
        if proto.producer_name:
            meta["producer"] = f"{proto.producer_name} {proto.producer_version}".strip()
        if self.batching_note is not None:
            meta["batching"] = self.batching_note
        self.info = ModelInfo(
            name=self.path.name,
            identity=identity,
            input_shape=self.input_shape,
            num_classes=self.num_classes,
            output=output,
            layout=layout,  # type: ignore[arg-type]
            batch=self.batch_mode,
            provider=provider,
            preprocessing=self.preprocessing,
            metadata=meta,
            white_box=WHITE_BOX if self._white_box_refusal is None
            else f"unavailable: {self._white_box_refusal}",
        )

    @property
    def cpu_threads(self) -> int:
        """The CPU threads one call of this model computes on: its onnxruntime intra-op
        threads, or where they were left to onnxruntime's default, the CPUs this process may
        run on (onnxruntime takes the physical cores among them)."""
        return self._sess_options.intra_op_num_threads or usable_cpus()

    # -- construction helpers -------------------------------------------------------------
    def _session(self, model: str | bytes) -> ort.InferenceSession:
        try:
            return _ort().InferenceSession(
                model, sess_options=self._sess_options, providers=self._providers
            )
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises several unrelated types
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelError(
                f"onnxruntime cannot load {self.path}: {first[:300]}",
                hint="check that the model is a valid ONNX graph for this onnxruntime version",
            ) from exc

    def _try_symbolic_batch(self, proto: onnx.ModelProto) -> None:
        """Make a batch of 1 symbolic where :func:`~certify.models.batching.prove_symbolic_batch`
        proves it and probe images answer the same alone and in batches; else keep it fixed."""
        proof = batching.prove_symbolic_batch(proto)
        why = proof.why
        session = None
        if proof.model is not None:
            try:
                session = _ort().InferenceSession(proof.model.SerializeToString(),
                                               sess_options=self._sess_options,
                                               providers=self._providers)
                x = self._to_model_input(probe_images(self.input_shape, 6))
                why = self._disagreement(session, x)
            except Exception as exc:  # noqa: BLE001 - onnxruntime refuses the rewrite
                why = f"onnxruntime cannot run the rewritten graph ({batching.first_line(exc)})"
        if why is None and session is not None and proof.model is not None:
            self.session = session
            self._proto = proof.model
            self.fixed_batch = None
            self.batch_mode = "symbolic (rewritten from fixed 1)"
            self.batching_note = batching.described(self.batch_mode, None)
        else:
            self.batch_mode = "fixed 1 (chunked)"
            self.batching_note = batching.described(self.batch_mode, why)
        log.info("model batch dimension: %s%s", self.batch_mode,
                 "" if why is None else f" ({why})")

    def _disagreement(self, session: ort.InferenceSession, x: np.ndarray) -> str | None:
        """Why ``session`` (a rewritten graph) answers images ``x`` (model input) differently in
        batches than the graph as written answers them one at a time, or ``None``."""
        def batched(arr: np.ndarray) -> np.ndarray:
            return typing.cast(np.ndarray, session.run([self.output_name],
                                                       {self.input_name: arr})[0])

        def alone(arr: np.ndarray) -> np.ndarray:
            return typing.cast(np.ndarray, self._fixed_session.run(
                [self.output_name], {self.input_name: arr})[0])
        return batching.same_alone_and_batched(batched, alone, x, torchcopy.TOLERANCE)

    def confirm_batching(self, x: torch.Tensor) -> str | None:
        """Check a proven rewrite on real images ``x`` (``[N, C, H, W]`` in [0, 1]): where they
        answer differently alone and in batches, go back to the graph's fixed batch of 1.
        Returns what changed, or ``None`` (not counted as queries: a check of the adapter)."""
        if not self.batch_mode.startswith("symbolic (rewritten") or self.session is None:
            return None
        try:
            why = self._disagreement(self.session, self._to_model_input(x))
        except Exception as exc:  # noqa: BLE001 - a batch the rewrite cannot run
            why = f"the rewritten graph fails on real images ({batching.first_line(exc)})"
        if why is None:
            return None
        self.session = self._fixed_session
        self._proto = onnx.load(str(self.path))
        self._feature_session = None
        self._torch_copy = None
        self.fixed_batch = 1
        self.batch_mode = "fixed 1 (chunked)"
        self.batching_note = batching.described(self.batch_mode, why)
        self.info = dataclasses.replace(
            self.info, batch=self.batch_mode,
            metadata={**self.info.metadata, "batching": self.batching_note})
        log.warning("model batch dimension: back to fixed 1: %s", why)
        return why

    def _probe_outputs(self) -> np.ndarray:
        x = probe_images(self.input_shape)
        try:
            out = self._run(self._to_model_input(x))
        except Exception as exc:  # noqa: BLE001
            raise ModelError(
                f"a test forward pass of {self.path.name} failed: {str(exc).splitlines()[0][:300]}",
                hint="check the model's input size and type",
            ) from exc
        if out.ndim in (1, 2) and out.shape[0] == 4:
            require_finite_probe(out, self.path.name)
            return out
        raise ModelError(
            f"model output {self.output_name!r} has shape {list(out.shape)} for 4 images",
            hint="certify needs class scores [N, K] or labels [N]",
        )

    def with_preprocessing(self, preprocessing: Preprocessing, layout: str | None = None
                           ) -> OnnxModel:
        """This model with another input preprocessing, sharing its onnxruntime session (no
        reload): how :mod:`certify.probe` tries candidates. The layout is the graph's own
        (its input shape states it); another ``layout`` is refused."""
        if layout is not None and layout != self.layout:
            raise ModelError(f"{self.path.name} takes {self.layout} input (its input shape "
                             f"says so), not {layout}", hint="the layout follows the graph")
        other = copy.copy(self)
        other.preprocessing = preprocessing
        other.info = dataclasses.replace(self.info, preprocessing=preprocessing)
        other._torch_copy = None  # built from the preprocessing: the view builds its own
        return other

    # -- the one verb ---------------------------------------------------------------------
    def _to_model_input(self, x: torch.Tensor) -> np.ndarray:
        arr = to_model_input(x, self.preprocessing, self.input_shape[0], self.layout)
        if self._np_dtype is np.uint8:
            return typing.cast(np.ndarray, np.clip(np.rint(arr), 0, 255).astype(np.uint8))
        return arr.astype(self._np_dtype, copy=False)

    def _run(self, arr: np.ndarray, session: ort.InferenceSession | None = None,
             output: str | None = None) -> np.ndarray:
        """One forward pass per chunk of the model's fixed batch (padded), or one in all."""
        session = session or self.session
        names = [output or self.output_name]
        fb = self.fixed_batch
        if fb is None:
            step = (_CALL_SIZE.get() or self._cpu_chunk) if self._cpu_chunk else 0
            if step and len(arr) > step:
                # on the CPU, onnxruntime is faster per image in calls of a few hundred images
                # than in one call of thousands (HopSkipJump's probe sets): same outputs
                return np.concatenate([session.run(names, {self.input_name: arr[i:i + step]})[0]
                                       for i in range(0, len(arr), step)])
            return typing.cast(np.ndarray, session.run(names, {self.input_name: arr})[0])
        outs = []
        n = len(arr)
        for start in range(0, n, fb):
            chunk = arr[start : start + fb]
            short = fb - len(chunk)
            if short:
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], short, axis=0)])
            outs.append(session.run(names, {self.input_name: chunk})[0])
        return np.concatenate(outs)[:n]

    def torch_copy(self) -> torchcopy.TorchCopy:
        """The graph as a torch module on the run's device, for white-box attacks (built on
        first use). Raises :class:`~certify.models.torchcopy.WhiteBoxUnavailable`."""
        if self._torch_copy is None:
            if self._white_box_refusal is not None:
                raise torchcopy.WhiteBoxUnavailable(self._white_box_refusal)
            self._torch_copy = torchcopy.TorchCopy(
                self._proto, self.preprocessing, self.input_shape[0], self.layout,
                self.num_classes, self.fixed_batch).to(self._torch_device)
        return self._torch_copy

    def refuse_white_box(self, why: str) -> None:
        """No white-box attacks on this model, for the reason ``why`` (said on the card): its
        torch copy failed where the run tried it (:func:`certify.engine.plan.try_white_box`)."""
        self._white_box_refusal = why
        self._torch_copy = None
        self.info = dataclasses.replace(self.info, white_box=f"unavailable: {why}")

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features ``[N, D]``: the input of the last Gemm/MatMul before the output.

        Raises :class:`ModelError` when the graph has no such tensor (``feature_name`` is None).
        """
        if self.feature_name is None:
            raise ModelError("no penultimate tensor found in the graph",
                             hint="the model has no final Gemm/MatMul layer")
        if self._feature_session is None:
            m = onnx.ModelProto()
            m.CopyFrom(self._proto)
            m.graph.output.append(onnx.helper.make_empty_tensor_value_info(self.feature_name))
            self._feature_session = self._session(m.SerializeToString())
        arr = self._to_model_input(x)
        feats = self._run(arr, self._feature_session, self.feature_name).reshape(len(arr), -1)
        return torch.from_numpy(np.ascontiguousarray(feats, dtype=np.float32)).to(x.device)

    def close(self) -> None:
        """Drop this model's onnxruntime sessions and torch copy (a view made by
        :meth:`with_preprocessing` keeps its own references)."""
        self._feature_session = None
        self._torch_copy = None
        self.session = None
        self._fixed_session = None

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Scores ``[N, K]`` for images ``x`` ``[N, C, H, W]`` in ``[0, 1]``."""
        out = self._run(self._to_model_input(x))
        if out.ndim == 1:
            scores = torch.nn.functional.one_hot(
                torch.from_numpy(out.astype(np.int64)), self.num_classes
            ).float()
        else:
            scores = torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))
        return scores.to(x.device)
