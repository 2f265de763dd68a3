"""A torch copy of an ONNX classifier's graph, for white-box (gradient) attacks.

certify's own converter, operator by operator (:mod:`certify.models.onnx_ops`: what torch's
exporters write for CNNs and vision transformers, held to ONNX's node tests). A graph with any
other operation is not converted: :class:`WhiteBoxUnavailable` names it and the way out
(:data:`WAY_OUT`), and the black-box attacks carry the verdict. The copy is never trusted on
its own: every candidate a white-box attack proposes is judged by onnxruntime on the real model
(the sealed attack call), and :func:`equivalence` compares the copy with the real model's
answers on the check's samples before it is used. A quantise-dequantise pair inside the network
passes the gradient straight through (BPDA).

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import onnx
import onnx.numpy_helper
import torch

from certify.models.base import (
    Model,
    Preprocessing,
    QueryCounter,
    as_scores,
    endpoint_of,
    preprocess,
)
from certify.models.batching import opset_of
from certify.models.onnx_ops import (
    N_OUTPUTS,
    NEEDS_OUTPUTS,
    STRAIGHT_THROUGH,
    Attrs,
    Op,
    op_for,
    tensor,
)
from certify.models.onnx_ops import OPS as _OPS

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


#: What a user whose graph the converter cannot copy does instead (said with the reason).
WAY_OUT = ("the way out: give certify the PyTorch program as a .pt2 "
           "(torch.export.save(torch.export.export(model.eval(), (x,)), \"model.pt2\")), whose "
           "gradients need no converter, or re-export the ONNX file with torch's other exporter "
           "(dynamo=False writes opsets 7 to 20, the dynamo exporter 18 and above), which writes "
           "other operations")


class WhiteBoxUnavailable(Exception):  # noqa: N818 - a reason, not a failure of certify
    """Why a model has no torch copy to take gradients from (said on the card)."""


Env = dict[str, torch.Tensor]
#: One graph node as the copy runs it: (operator type, its converter at the graph's opset,
#: input names ("" for an omitted optional input), output names, attributes, label).
Node = tuple[str, Op, list[str], list[str], Attrs, str]


def read_nodes(graph: onnx.GraphProto, opset: int) -> list[Node]:
    """``graph``'s nodes as :func:`run_nodes` runs them, read once (not per pass), each
    operator's converter taken at ``opset`` (:func:`~certify.models.onnx_ops.op_for`)."""
    readers: dict[str, set[str]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, set()).add(n.op_type)
    outputs = {o.name for o in graph.output}

    def added(n: onnx.NodeProto) -> Attrs:
        named = len(n.output) if n.op_type == "Split" else sum(1 for o in n.output if o)
        extra: Attrs = {N_OUTPUTS: named} if n.op_type in NEEDS_OUTPUTS else {}
        if n.op_type == "QuantizeLinear" and n.output[0] not in outputs and \
                readers.get(n.output[0]) == {"DequantizeLinear"}:
            extra[STRAIGHT_THROUGH] = True
        return extra
    return [(n.op_type, op_for(n.op_type, opset), list(n.input), list(n.output),
             {**{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}, **added(n)},
             n.name or n.op_type) for n in graph.node]


def run_nodes(nodes: list[Node], env: Env, stop: str | None = None) -> Env:
    """Run ``nodes`` in order on ``env`` (the graph's inputs and constants by name), adding
    each node's outputs to it; returns ``env``, early once the tensor ``stop`` is computed.
    Raises :class:`WhiteBoxUnavailable` naming the node whose converter failed."""
    for op_type, op, inputs, outputs, attrs, label in nodes:
        args = [env[i] if i else None for i in inputs]
        try:
            outs = op(args, attrs)
        except Exception as exc:  # noqa: BLE001 - any failure: the copy cannot be used
            raise WhiteBoxUnavailable(
                f"the torch copy failed at node {label} ({op_type}): "
                f"{type(exc).__name__}: {str(exc)[:200]}; {WAY_OUT}") from exc
        for name, value in zip(outputs, outs, strict=False):
            if name:
                env[name] = value
        if stop is not None and stop in env:
            return env
    return env


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
    unsupported = sorted({n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
                          for n in graph.node
                          if n.op_type not in _OPS or n.domain not in ("", "ai.onnx")})
    if unsupported:
        return ("the graph uses operation(s) certify's torch converter does not support: "
                f"{', '.join(unsupported)}; {WAY_OUT}")
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
        nodes = read_nodes(graph, self.opset)
        constants = {i.name: tensor(onnx.numpy_helper.to_array(i)) for i in graph.initializer}
        # Constant nodes are constants too: held with the initializers, so that .to(device)
        # moves them (a Constant made on the CPU beside a tensor on the GPU would fail)
        for op_type, op, _, outputs, attrs, label in nodes:
            if op_type == "Constant":
                try:
                    constants[outputs[0]] = op([], attrs)[0]
                except Exception as exc:  # noqa: BLE001 - said as the copy's failure
                    raise WhiteBoxUnavailable(
                        f"the torch copy failed at node {label} (Constant): "
                        f"{type(exc).__name__}: {str(exc)[:200]}; {WAY_OUT}") from exc
        self.nodes = [n for n in nodes if n[0] != "Constant"]
        self._buffer_of: dict[str, str] = {}
        for k, name in enumerate(sorted(constants)):
            # buffers, so .to(device) moves them
            self.register_buffer(f"c{k}", constants[name], persistent=False)
            self._buffer_of[name] = f"c{k}"
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
        return run_nodes(self.nodes, env, stop)

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
        return _scores(out, n, self.num_classes)

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
        return _scores(env[self.output_name], *logits.shape)

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
            if not value.requires_grad:
                raise WhiteBoxUnavailable(
                    "no gradient reaches the input: the graph turns it into integers or "
                    "booleans on the way to its last linear layer (a Cast, a comparison, a "
                    "QuantizeLinear not read by DequantizeLinear alone), so a white-box attack "
                    "would find nothing and prove nothing")
            (grad,) = torch.autograd.grad(value.sum(), xg)
        scores = self._as_scores(answer.detach(), len(x))
        return scores, cut.detach(), value.detach(), grad.detach()


def _scores(out: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """:func:`~certify.models.base.as_scores` of the copy's answer, read as the real model's
    is: integer scores ``[N, K]`` (a QuantizeLinear or integer Cast head) are scores, not
    labels."""
    if out.dim() >= 2 and not out.is_floating_point() and math.prod(out.shape[1:]) > 1:
        out = out.float()
    return as_scores(out, n, k)


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
