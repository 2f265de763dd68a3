"""A torch copy of an ONNX classifier's graph, for white-box (gradient) attacks.

certify's own converter for the operations image classifiers are exported with (convolutions,
linear layers, pooling, normalisation, activations, reshapes and the usual output heads). A
graph with any other operation is not converted: :class:`WhiteBoxUnavailable` says which, and
the black-box attacks carry the verdict. The copy is never trusted on its own: every candidate a
white-box attack proposes is judged by onnxruntime on the real model (the sealed attack call),
and :func:`equivalence` compares the copy with the real model's answers on the check's samples
before it is used.

**Heads that starve gradients** (Athalye et al. 2018, BPDA). Rounding, quantising, arg-max,
top-k and saturating softmax after the classifier's last linear layer leave no useful input
gradient. :attr:`TorchCopy.cut` is the last linear layer's output (the ``Gemm``/``MatMul`` and
its bias): the attacks take their gradients there, while the model's decisions come from the
whole graph, head included (:meth:`TorchCopy.scores`).

Shapes: ``x`` ``[N, C, H, W]`` float32 in ``[0, 1]`` (certify's convention); the copy applies
the model's preprocessing (scale, mean/std, channel order, layout) itself, differentiably.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import onnx
import onnx.numpy_helper
import torch
import torch.nn.functional as F

from certify.models.base import (
    Model,
    Preprocessing,
    QueryCounter,
    as_scores,
    endpoint_of,
    preprocess,
)
from certify.models.batching import opset_of

#: Operations allowed between the last linear layer and the output (per-sample, no mixing
#: across the batch): the gradient is taken before them (BPDA), decisions after them.
HEAD_OPS = frozenset({"Round", "Floor", "Ceil", "Mul", "Div", "Add", "Sub", "Softmax", "Hardmax",
                      "LogSoftmax", "Clip", "Cast", "Identity", "ArgMax", "TopK", "Sigmoid",
                      "QuantizeLinear", "DequantizeLinear", "Relu", "Neg", "Exp", "Log"})
#: Operations that quantise scores: a head holding one is reported on the card.
QUANTISING = frozenset({"Round", "Floor", "Ceil", "ArgMax", "TopK", "QuantizeLinear", "Cast",
                        "Hardmax"})
#: The same, as the operation names of a PyTorch program's head (aten operations).
QUANTISING_NAMES = frozenset({"round", "floor", "ceil", "argmax", "topk", "sign", "trunc",
                              "quantize_per_tensor", "quantize_per_channel",
                              "fake_quantize_per_tensor_affine"})
#: Largest |score difference| (relative to the scores' scale) the copy may have from the model.
TOLERANCE = 1e-4
#: With a quantising head, float rounding before it can move a score by one step on a few
#: samples: at most this share of samples may differ beyond the tolerance (decisions never).
QUANTISED_SHARE = 0.01


log = logging.getLogger("certify")
#: Set once ``torch.func.vmap`` could not map a model (said once per process in the log).
_VMAP_REFUSED: list[bool] = []


class WhiteBoxUnavailable(Exception):  # noqa: N818 - a reason, not a failure of certify
    """Why a model has no torch copy to take gradients from (said on the card)."""


Env = dict[str, torch.Tensor]
#: ONNX attributes of one node, by name (ints, floats, strings, lists, tensors).
Attrs = dict[str, Any]
Op = Callable[[list[torch.Tensor | None], Attrs], list[torch.Tensor]]


@dataclass(frozen=True)
class Equivalence:
    """How the copy compares with the real model on a batch: ``max_diff`` the largest
    |score difference| (absolute), ``scale`` the scores' largest magnitude, ``differing`` the
    samples beyond the tolerance, ``decisions_differ`` the samples whose top class differs."""

    n: int
    max_diff: float
    scale: float
    differing: int
    decisions_differ: int
    quantised: bool

    @property
    def ok(self) -> bool:
        """Same decisions everywhere, and scores within the tolerance (a quantising head may
        miss it on at most :data:`QUANTISED_SHARE` of the samples)."""
        allowed = math.floor(QUANTISED_SHARE * self.n) if self.quantised else 0
        return self.decisions_differ == 0 and self.differing <= allowed

    def why(self) -> str:
        """The disagreement in words (for the card)."""
        return (f"the torch copy of the graph differs from onnxruntime on {self.n} samples: "
                f"{self.decisions_differ} decision(s) differ, {self.differing} sample(s) "
                f"beyond the tolerance {TOLERANCE:g} × {self.scale:.3g} (max |Δ| "
                f"{self.max_diff:.3g})")


def equivalence(copy_scores: torch.Tensor, model_scores: torch.Tensor,
                quantised: bool) -> Equivalence:
    """Compare the copy's scores ``[N, K]`` with the real model's on the same images."""
    a = copy_scores.detach().float().cpu()
    b = model_scores.detach().float().cpu()
    scale = float(b.abs().max()) if b.numel() else 0.0
    per = (a - b).abs().flatten(1).amax(dim=1) if len(a) else torch.zeros(0)
    tol = TOLERANCE * max(1.0, scale)
    return Equivalence(
        n=len(a), max_diff=float(per.max()) if len(per) else 0.0, scale=scale,
        differing=int((per > tol).sum()),
        decisions_differ=int((a.argmax(1) != b.argmax(1)).sum()), quantised=quantised)


class Differentiable(Protocol):
    """What the white-box attacks differentiate: :class:`TorchCopy` for an ONNX graph, the
    program itself for a PyTorch program (:class:`~certify.models.torchprog.ProgramGradients`).
    Scores come from the whole model, gradients from the cut (BPDA)."""

    #: the operations after the cut (empty: the cut is the output)
    head: tuple[str, ...]
    #: whether the head quantises scores (rounding, arg-max, ...)
    quantised: bool

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """The whole model's answer ``[N, K]`` (one-hot for labels)."""
        ...

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`scores` (the predictor interface)."""
        ...

    def apply_head(self, logits: torch.Tensor) -> torch.Tensor:
        """The head applied to ``logits`` in place of the cut."""
        ...

    def value_and_grad(self, x: torch.Tensor, loss: Callable[[torch.Tensor], torch.Tensor]
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(scores, cut logits, ``loss(cut)``, its input gradient), detached."""
        ...


@runtime_checkable
class WhiteBoxModel(Model, Protocol):
    """A model whose graph certify holds: white-box attacks take its gradients."""

    def torch_copy(self) -> Differentiable:
        """What the attacks differentiate (built once; raises ``WhiteBoxUnavailable``): a
        torch copy of an ONNX graph, or a PyTorch program itself."""
        ...

    def refuse_white_box(self, why: str) -> None:
        """No white-box attacks from now on, for the reason ``why`` (said on the card):
        :meth:`torch_copy` raises ``WhiteBoxUnavailable`` with it."""
        ...


def white_box_of(model: object) -> WhiteBoxModel | None:
    """The white-box model behind ``model`` (through query counters), or ``None``."""
    while isinstance(model, QueryCounter):
        model = model.model
    return model if isinstance(model, WhiteBoxModel) else None


def transfer_source_of(model: object) -> WhiteBoxModel | None:
    """The surrogate whose graph white-box attacks use on the endpoint behind ``model``
    (through query counters; ``--surrogate``), or ``None``."""
    while isinstance(model, QueryCounter):
        model = model.model
    endpoint = endpoint_of(model)
    found = None if endpoint is None else endpoint.surrogate
    return found if isinstance(found, WhiteBoxModel) else None


def refusal(proto: onnx.ModelProto) -> str | None:
    """Why the graph has no torch copy (an integer input, an unsupported operation), or
    ``None`` when :class:`TorchCopy` converts it. Cheap: no weights are copied."""
    graph = proto.graph
    initializers = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    elem = inputs[0].type.tensor_type.elem_type if inputs else 0
    if elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE):
        return (f"the model's input is {onnx.helper.tensor_dtype_to_string(elem)}: an integer "
                "input has no gradient, so only black-box attacks apply")
    unsupported = sorted({n.op_type for n in graph.node if n.op_type not in _OPS})
    if unsupported:
        return ("the graph uses operation(s) certify's torch converter does not support: "
                f"{', '.join(unsupported)}")
    return None


class TorchCopy(torch.nn.Module):
    """The graph of an ONNX classifier as a torch module (see the module's docstring).

    ``forward(x)`` returns the tensor at the cut (``[N, K]`` logits of the last linear layer:
    what gradients are taken of); :meth:`scores` the whole graph's answer as certify's
    ``predict`` gives it (``[N, K]``; one-hot for a labels output).
    """

    def __init__(self, proto: onnx.ModelProto, preprocessing: Preprocessing, channels: int,
                 layout: str, num_classes: int, fixed_batch: int | None = None) -> None:
        super().__init__()
        why = refusal(proto)
        if why is not None:
            raise WhiteBoxUnavailable(why)
        graph = proto.graph
        initializers = {i.name for i in graph.initializer}
        inputs = [i for i in graph.input if i.name not in initializers]
        self.input_name = inputs[0].name
        self.output_name = graph.output[0].name
        self.pre = preprocessing
        self.channels = channels
        self.layout = layout
        self.num_classes = num_classes
        #: the batch the graph is written for (``None``: any); a batch of 1 runs per image
        #: through ``torch.func.vmap``, a larger one in padded chunks (:func:`per_sample`)
        self.fixed_batch = fixed_batch
        self.opset = opset_of(proto)
        # each node's operation, inputs, outputs and attributes, read once (not per pass)
        self.nodes = [(n.op_type, op_for(n.op_type, self.opset), list(n.input), list(n.output),
                       {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute},
                       n.name or n.op_type) for n in graph.node]
        self._buffer_of: dict[str, str] = {}
        for k, init in enumerate(sorted(graph.initializer, key=lambda i: i.name)):
            # buffers, so .to(device) moves them
            self.register_buffer(f"c{k}", _tensor(onnx.numpy_helper.to_array(init)),
                                 persistent=False)
            self._buffer_of[init.name] = f"c{k}"
        self.cut, self.head = _find_cut(graph, initializers)
        self.quantised = any(op in QUANTISING for op in self.head)
        self.eval()

    # -- evaluation -----------------------------------------------------------------------
    def _input(self, x: torch.Tensor) -> torch.Tensor:
        """certify's ``[N, C, H, W]`` RGB batch in [0, 1] as the graph wants it (differentiable)."""
        return preprocess(x, self.pre, self.channels, self.layout)

    def _run(self, x: torch.Tensor, stop: str | None) -> Env:
        env: Env = {name: getattr(self, buf) for name, buf in self._buffer_of.items()}
        env[self.input_name] = self._input(x)
        for op_type, op, inputs, outputs, attrs, label in self.nodes:
            args = [env[i] if i else None for i in inputs]
            try:
                outs = op(args, attrs)
            except Exception as exc:  # noqa: BLE001 - any failure: the copy cannot be used
                raise WhiteBoxUnavailable(
                    f"the torch copy failed at node {label} ({op_type}): "
                    f"{type(exc).__name__}: {str(exc)[:200]}") from exc
            for name, value in zip(outputs, outs, strict=False):
                if name:
                    env[name] = value
            if stop is not None and stop in env:
                return env
        return env

    def _tensors(self, x: torch.Tensor, names: tuple[str, ...]) -> tuple[torch.Tensor, ...]:
        """The graph's tensors ``names`` for the batch ``x``, the graph run at the batch it is
        written for (:func:`per_sample`); evaluation stops once they are computed."""
        def graph(part: torch.Tensor) -> tuple[torch.Tensor, ...]:
            env = self._run(part, names[0] if len(names) == 1 else None)
            return tuple(env[n] for n in names)
        return per_sample(graph, x, self.fixed_batch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The last linear layer's output ``[N, K]`` for ``x`` in [0, 1] (gradients flow)."""
        (out,) = self._tensors(x, (self.cut,))
        return out.reshape(len(x), -1).float()

    @torch.no_grad()
    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """The whole graph's answer ``[N, K]`` (one-hot for labels), as ``predict`` gives it."""
        return self._as_scores(self._tensors(x, (self.output_name,))[0], len(x))

    def _as_scores(self, out: torch.Tensor, n: int) -> torch.Tensor:
        """The graph's output as ``[N, K]`` scores (labels become one-hot)."""
        return as_scores(out, n, self.num_classes)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`scores` (the predictor interface: a white-box attack's forward pass)."""
        return self.scores(x)

    @torch.no_grad()
    def apply_head(self, logits: torch.Tensor) -> torch.Tensor:
        """The graph's operations after the cut applied to ``logits`` ``[N, K']`` in place of
        the last linear layer's output (any number of classes ``K'``), as the graph's answer
        (one-hot of ``K'`` for a labels output). Raises :class:`WhiteBoxUnavailable` when the
        head needs more than the cut (it cannot run on its own)."""
        env: Env = {name: getattr(self, buf) for name, buf in self._buffer_of.items()}
        env[self.cut] = logits
        for op_type, op, inputs, outputs, attrs, label in self.nodes:
            if any(i and i not in env for i in inputs) or all(o in env for o in outputs if o):
                continue
            try:
                outs = op([env[i] if i else None for i in inputs], attrs)
            except Exception as exc:  # noqa: BLE001 - any failure: the head cannot be used
                raise WhiteBoxUnavailable(
                    f"the output head failed at node {label} ({op_type}) on a planted "
                    f"readout: {type(exc).__name__}: {str(exc)[:200]}") from exc
            env.update({o: v for o, v in zip(outputs, outs, strict=False) if o})
        if self.output_name not in env:
            raise WhiteBoxUnavailable("the output head needs more than the last linear "
                                      "layer's output")
        return as_scores(env[self.output_name], *logits.shape)

    def value_and_grad(self, x: torch.Tensor, loss: Callable[[torch.Tensor], torch.Tensor]
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One forward and backward pass: (whole-graph scores ``[N, K]``, cut logits
        ``[N, K]``, ``loss(cut)`` ``[N]``, its gradient with respect to ``x``), all detached.

        The loss is taken at the cut, the decisions after the head (BPDA).
        """
        xg = x.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            cut_out, answer = self._tensors(xg, (self.cut, self.output_name))
            cut = cut_out.reshape(len(x), -1).float()
            value = loss(cut)
            (grad,) = torch.autograd.grad(value.sum(), xg)
        scores = self._as_scores(answer.detach(), len(x))
        return scores, cut.detach(), value.detach(), grad.detach()


def batches(x: torch.Tensor, fixed: int | None) -> Iterator[tuple[torch.Tensor, int]]:
    """``x`` in pieces a graph takes: whole, or its ``fixed`` batch size with the last piece
    padded by repeating its last image (as onnxruntime is fed); each with how many of its
    images are real."""
    if fixed is None:
        yield x, len(x)
        return
    for start in range(0, len(x), fixed):
        part = x[start:start + fixed]
        n = len(part)
        if n < fixed:
            part = torch.cat([part, part[-1:].expand(fixed - n, *part.shape[1:])])
        yield part, n


def per_sample(fn: Callable[[torch.Tensor], tuple[torch.Tensor, ...]], x: torch.Tensor,
               fixed: int | None) -> tuple[torch.Tensor, ...]:
    """``fn``'s outputs for the batch ``x``, ``fn`` being a function written for a batch of
    ``fixed`` images (``None``: any batch). A batch of 1 is mapped over the images with
    ``torch.func.vmap`` (a ``Reshape`` to ``[1, 1024]`` holds for each image; gradients flow
    as through a loop over the images, at batched speed); a larger fixed batch runs in padded
    chunks. Outputs are concatenated along their first axis, as onnxruntime's chunks are."""
    if fixed is None:
        return fn(x)
    if not len(x):  # no image to map: the outputs' shapes from one zero image, empty
        one = fn(torch.zeros(fixed, *x.shape[1:], dtype=x.dtype, device=x.device))
        tie = x.sum() * 0  # keeps them connected to x for a gradient (of zeros)
        return tuple(o[:0] + tie if o.is_floating_point() else o[:0] for o in one)
    if fixed == 1:
        try:
            outs = torch.func.vmap(lambda xi: fn(xi.unsqueeze(0)))(x)
        except WhiteBoxUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - a program vmap cannot map (TorchScript)
            if not _VMAP_REFUSED:
                log.info("torch.func.vmap cannot map the model over images (%s): one image "
                         "per call", f"{type(exc).__name__}: {str(exc)[:120]}")
                _VMAP_REFUSED.append(True)
            each = [fn(x[i:i + 1]) for i in range(len(x))]
            return tuple(torch.cat([e[k].reshape(1) if e[k].dim() == 0 else e[k] for e in each])
                         for k in range(len(each[0])))
        return tuple(o.flatten(0, 1) if o.dim() >= 2 else o for o in outs)
    parts = [(fn(p), n) for p, n in batches(x, fixed)]
    return tuple(torch.cat([outs[k][:n] for outs, n in parts]) for k in range(len(parts[0][0])))


def _find_cut(graph: onnx.GraphProto, consts: set[str]) -> tuple[str, tuple[str, ...]]:
    """(the last linear layer's output tensor, the head operations after it, in order).

    Walks back from the output through :data:`HEAD_OPS` with one non-constant input; the cut is
    where the walk reaches a ``Gemm`` or ``MatMul`` (plus a constant bias ``Add`` right after
    it). Anything else ends the walk with the cut at the output itself (no head).
    """
    consts = set(consts) | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    producer = {o: n for n in graph.node for o in n.output}
    out = graph.output[0].name
    tensor = out
    passed: list[tuple[str, onnx.NodeProto]] = []
    while tensor in producer:
        node = producer[tensor]
        if node.op_type in ("Gemm", "MatMul"):
            # a bias Add on a MatMul belongs to the layer: move the cut back over it
            while passed and passed[-1][1].op_type == "Add" and \
                    any(i in consts for i in passed[-1][1].input):
                tensor = passed.pop()[0]
            return tensor, tuple(n.op_type for _, n in reversed(passed))
        data = [i for i in node.input if i and i not in consts]
        if node.op_type not in HEAD_OPS or len(data) != 1:
            break
        passed.append((tensor, node))
        tensor = data[0]
    return out, ()


def _tensor(arr: np.ndarray) -> torch.Tensor:
    if arr.dtype in (np.float16, np.float64):
        arr = arr.astype(np.float32)
    return torch.from_numpy(np.array(arr, copy=True))


# -- operations ---------------------------------------------------------------------------
def _ints(v: Any) -> list[int]:
    """A repeated integer attribute as a list."""
    return [int(i) for i in (v if isinstance(v, list | tuple) else [v])]


def _a(args: list[torch.Tensor | None], k: int) -> torch.Tensor:
    t = args[k]
    if t is None:
        raise ValueError(f"input {k} is missing")
    return t


def _pads2d(attrs: Attrs, kernel: Sequence[int]) -> tuple[int, int, int, int]:
    """ONNX pads ``[top, left, bottom, right]`` as F.pad's ``(left, right, top, bottom)``."""
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto not in ("NOTSET", "VALID"):
        raise ValueError(f"auto_pad {auto} is not supported")
    pads = _ints(attrs.get("pads", [0] * (2 * len(kernel))))
    if auto == "VALID":
        pads = [0] * 4
    return pads[1], pads[3], pads[0], pads[2]


def _conv(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    x, w, b = _a(args, 0), _a(args, 1), (args[2] if len(args) > 2 else None)
    if w.dim() != 4:
        raise ValueError("only 2-D convolutions are supported")
    kernel = _ints(attrs.get("kernel_shape", list(w.shape[2:])))
    left, right, top, bottom = _pads2d(attrs, kernel)
    stride = _ints(attrs.get("strides", [1, 1]))
    dil = _ints(attrs.get("dilations", [1, 1]))
    group = int(attrs.get("group", 1))
    if (left, top) == (right, bottom):
        return [F.conv2d(x, w, b, stride, (top, left), dil, group)]
    x = F.pad(x, (left, right, top, bottom))
    return [F.conv2d(x, w, b, stride, 0, dil, group)]


def _pool(kind: str) -> Op:
    def op(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
        x = _a(args, 0)
        kernel = _ints(attrs["kernel_shape"])
        left, right, top, bottom = _pads2d(attrs, kernel)
        stride = _ints(attrs.get("strides", [1, 1]))
        ceil = bool(attrs.get("ceil_mode", 0))
        if kind == "max":
            dil = _ints(attrs.get("dilations", [1, 1]))
            if (left, top) == (right, bottom) and top <= kernel[0] // 2 and \
                    left <= kernel[1] // 2:
                return [F.max_pool2d(x, kernel, stride, (top, left), dil, ceil)]
            x = F.pad(x, (left, right, top, bottom), value=float("-inf"))
            return [F.max_pool2d(x, kernel, stride, 0, dil, ceil)]
        include = bool(attrs.get("count_include_pad", 0))
        if (left, top) == (right, bottom):
            return [F.avg_pool2d(x, kernel, stride, (top, left), ceil, include)]
        raise ValueError("asymmetric average pooling pads are not supported")
    return op


def _gemm(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    a, b = _a(args, 0), _a(args, 1)
    if int(attrs.get("transA", 0)):
        a = a.t()
    if int(attrs.get("transB", 0)):
        b = b.t()
    y = float(attrs.get("alpha", 1.0)) * (a @ b)
    if len(args) > 2 and args[2] is not None:
        y = y + float(attrs.get("beta", 1.0)) * args[2]
    return [y]


def _reshape(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    x, shape = _a(args, 0), [int(s) for s in _a(args, 1).tolist()]
    shape = [x.shape[k] if s == 0 and not attrs.get("allowzero") else s
             for k, s in enumerate(shape)]
    return [x.reshape(shape)]


def _axes(args: list[torch.Tensor | None], attrs: Attrs) -> list[int]:
    if len(args) > 1 and args[1] is not None:
        return [int(a) for a in args[1].tolist()]
    return _ints(attrs.get("axes", []))


def _squeeze(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    x, axes = _a(args, 0), _axes(args, attrs)
    if not axes:
        return [x.squeeze()]
    for ax in sorted((a % x.dim() for a in axes), reverse=True):
        x = x.squeeze(ax)
    return [x]


def _unsqueeze(args: list[torch.Tensor | None], attrs: Attrs
               ) -> list[torch.Tensor]:
    x, axes = _a(args, 0), _axes(args, attrs)
    rank = x.dim() + len(axes)
    for ax in sorted(a % rank for a in axes):
        x = x.unsqueeze(ax)
    return [x]


def _batchnorm(args: list[torch.Tensor | None], attrs: Attrs
               ) -> list[torch.Tensor]:
    x, scale, bias, mean, var = (_a(args, k) for k in range(5))
    eps = float(attrs.get("epsilon", 1e-5))
    return [F.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)]


def _clip(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    x = _a(args, 0)
    lo = args[1] if len(args) > 1 and args[1] is not None else attrs.get("min")
    hi = args[2] if len(args) > 2 and args[2] is not None else attrs.get("max")
    lo_v = float(lo) if lo is not None else None
    hi_v = float(hi) if hi is not None else None
    return [x.clamp(lo_v, hi_v)]


def _softmax(log: bool) -> Op:
    def op(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
        axis = int(attrs.get("axis", -1))
        f = F.log_softmax if log else F.softmax
        return [f(_a(args, 0), dim=axis)]
    return op


def _hardmax(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """One-hot of the first largest value along ``axis`` (opset 13 on)."""
    x = _a(args, 0)
    axis = int(attrs.get("axis", -1)) % x.dim()
    return [F.one_hot(x.argmax(dim=axis), x.shape[axis]).movedim(-1, axis).to(x.dtype)]


def _flattened(op: Op) -> Op:
    """An operation of Softmax's family as ONNX defined it before opset 13: the input is
    flattened to 2-D from ``axis`` (default 1) on and the operation acts along the second
    axis (so ``axis=1`` of a ``[2, 3, 4]`` tensor normalises over 12 values, not 3)."""
    def pre13(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
        x = _a(args, 0)
        axis = int(attrs.get("axis", 1)) % max(x.dim(), 1)
        flat = x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
        return [op([flat], {"axis": 1})[0].reshape(x.shape)]
    return pre13


#: Operations whose semantics changed with opset 13 (their older form).
_BEFORE_13: dict[str, Op] = {"Softmax": _flattened(_softmax(False)),
                             "LogSoftmax": _flattened(_softmax(True)),
                             "Hardmax": _flattened(_hardmax)}


def op_for(op_type: str, opset: int) -> Op:
    """The converter of ``op_type`` with the semantics of the graph's ``opset``."""
    if opset < 13 and op_type in _BEFORE_13:
        return _BEFORE_13[op_type]
    return _OPS[op_type]


def _cast(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    x, to = _a(args, 0), int(attrs["to"])
    if to in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE):
        return [x.float()]
    if to == onnx.TensorProto.BOOL:
        return [x != 0]
    return [x.trunc().long() if x.is_floating_point() else x.long()]


def _argmax(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    axis = int(attrs.get("axis", 0))
    keep = bool(attrs.get("keepdims", 1))
    return [_a(args, 0).argmax(dim=axis, keepdim=keep)]


def _topk(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    k = int(_a(args, 1).reshape(-1)[0])
    axis = int(attrs.get("axis", -1))
    largest = bool(attrs.get("largest", 1))
    values, index = _a(args, 0).topk(k, dim=axis, largest=largest)
    return [values, index]


def _gather(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    x, idx = _a(args, 0), _a(args, 1).long()
    axis = int(attrs.get("axis", 0)) % x.dim()
    out = x.index_select(axis, idx.reshape(-1))
    shape = list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1:])
    return [out.reshape(shape)]


def _constant(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    if "value" in attrs:
        return [_tensor(onnx.numpy_helper.to_array(attrs["value"]))]
    for key in ("value_float", "value_int"):
        if key in attrs:
            return [torch.tensor(attrs[key])]
    for key in ("value_floats", "value_ints"):
        if key in attrs:
            return [torch.tensor(list(attrs[key]))]
    raise ValueError("unsupported Constant attribute")


def _pad(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    x = _a(args, 0)
    mode = attrs.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    pads = [int(p) for p in (args[1].tolist() if len(args) > 1 and args[1] is not None
                             else _ints(attrs.get("pads", [])))]
    value = float(args[2]) if len(args) > 2 and args[2] is not None else 0.0
    r = x.dim()
    spec: list[int] = []
    for d in reversed(range(r)):
        spec += [pads[d], pads[d + r]]
    if mode != "constant":
        raise ValueError(f"Pad mode {mode} is not supported")
    return [F.pad(x, spec, value=value)]


def _reduce(f: Callable[..., torch.Tensor]) -> Op:
    def op(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
        x = _a(args, 0)
        axes = _axes(args, attrs) or list(range(x.dim()))
        return [f(x, dim=axes, keepdim=bool(attrs.get("keepdims", 1)))]
    return op


def _unary(f: Callable[[torch.Tensor], torch.Tensor]) -> Op:
    return lambda args, attrs: [f(_a(args, 0))]


def _binary(f: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Op:
    return lambda args, attrs: [f(_a(args, 0), _a(args, 1))]


def _fold(f: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
          args: list[torch.Tensor | None]) -> torch.Tensor:
    present = [a for a in args if a is not None]
    out = present[0]
    for a in present[1:]:
        out = f(out, a)
    return out


def _flatten(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    x = _a(args, 0)
    axis = int(attrs.get("axis", 1)) % max(x.dim(), 1)
    return [x.reshape(int(np.prod(x.shape[:axis])), -1)]


def _quant(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    x, scale = _a(args, 0), _a(args, 1)
    zero = args[2] if len(args) > 2 and args[2] is not None else torch.zeros((), dtype=torch.uint8)
    lo, hi = (0, 255) if zero.dtype == torch.uint8 else (-128, 127)
    return [(torch.round(x / scale) + zero.float()).clamp(lo, hi)]


def _dequant(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    x, scale = _a(args, 0), _a(args, 1)
    zero = args[2] if len(args) > 2 and args[2] is not None else torch.zeros(())
    return [(x.float() - zero.float()) * scale]


_OPS: dict[str, Op] = {
    "Conv": _conv, "Gemm": _gemm, "MaxPool": _pool("max"), "AveragePool": _pool("avg"),
    "GlobalAveragePool": _unary(lambda x: x.mean(dim=(2, 3), keepdim=True)),
    "GlobalMaxPool": _unary(lambda x: x.amax(dim=(2, 3), keepdim=True)),
    "MatMul": _binary(torch.matmul), "Add": _binary(torch.add), "Sub": _binary(torch.sub),
    "Mul": _binary(torch.mul), "Div": _binary(torch.div), "Pow": _binary(torch.pow),
    "Max": lambda args, attrs: [_fold(torch.maximum, args)],
    "Min": lambda args, attrs: [_fold(torch.minimum, args)],
    "Relu": _unary(F.relu), "Sigmoid": _unary(torch.sigmoid), "Tanh": _unary(torch.tanh),
    "LeakyRelu": lambda args, attrs: [F.leaky_relu(
        _a(args, 0), float(attrs.get("alpha", 0.01)))],
    "Elu": lambda args, attrs: [F.elu(_a(args, 0), float(attrs.get("alpha", 1.0)))],
    "HardSigmoid": lambda args, attrs: [(float(attrs.get("alpha", 0.2)) * _a(args, 0)
                                         + float(attrs.get("beta", 0.5))).clamp(0, 1)],
    "HardSwish": _unary(F.hardswish), "Erf": _unary(torch.erf), "Exp": _unary(torch.exp),
    "Log": _unary(torch.log), "Sqrt": _unary(torch.sqrt), "Neg": _unary(torch.neg),
    "Abs": _unary(torch.abs), "Reciprocal": _unary(torch.reciprocal),
    "Round": _unary(torch.round), "Floor": _unary(torch.floor), "Ceil": _unary(torch.ceil),
    "Identity": _unary(lambda x: x), "Dropout": lambda args, attrs: [_a(args, 0)],
    "Flatten": _flatten, "Reshape": _reshape, "Squeeze": _squeeze, "Unsqueeze": _unsqueeze,
    "Transpose": lambda args, attrs: [_a(args, 0).permute(
        *(_ints(attrs["perm"]) if "perm" in attrs else
          list(reversed(range(_a(args, 0).dim())))))],
    "Concat": lambda args, attrs: [torch.cat([a for a in args if a is not None],
                                             dim=int(attrs["axis"]))],
    "Shape": lambda args, attrs: [torch.tensor(list(_a(args, 0).shape))],
    "Gather": _gather, "Constant": _constant, "BatchNormalization": _batchnorm,
    "Clip": _clip, "Softmax": _softmax(False), "LogSoftmax": _softmax(True),
    "Hardmax": _hardmax, "Cast": _cast,
    "ArgMax": _argmax, "TopK": _topk, "Pad": _pad,
    "ReduceMean": _reduce(torch.mean), "ReduceSum": _reduce(torch.sum),
    "QuantizeLinear": _quant, "DequantizeLinear": _dequant,
}
