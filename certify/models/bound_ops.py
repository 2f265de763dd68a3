"""Bound propagation over a classifier's graph: certified lower bounds of the margin.

The operator table of certify's verifier, beside :mod:`certify.models.onnx_ops` (whose
converters it reuses for the graph's concrete values and its linear operators). One op set, two
front ends: :class:`BoundGraph` reads an ONNX graph; :func:`certify.models.bound_fx.
fx_bound_graph` translates the FX graph of a ``torch.export`` program into the same table (ONNX
operator types and attributes, through :meth:`BoundGraph.from_table`). Three methods,
each at least as tight as the one before by construction (every method's bound of each margin
row is the maximum of its own and the previous method's):

* ``ibp``: interval bound propagation (Gowal et al. 2018), an interval for every tensor.
* ``crown``: backward linear relaxation (CROWN, Zhang et al. 2018; DeepPoly, Singh et al. 2019)
  from the specification matrix ``C`` (rows: true logit − other logit) to the input. The
  pre-activation bounds of every ReLU, LeakyRelu and MaxPool input are computed by CROWN too
  (intersected with IBP; tensors above :attr:`BoundGraph.max_crown_neurons` neurons per sample
  keep IBP's). ReLU: upper line through ``(l, 0)`` and ``(u, u)``, lower line ``α·x`` with
  ``α = 1`` where ``u > −l`` else ``0``.
* ``alpha``: α-CROWN (Xu et al. 2021): the lower slopes ``α ∈ [slope, 1]`` of every unstable
  ReLU / LeakyRelu, one per (sample, margin row, neuron), optimised by projected Adam on the
  final lower bound (intermediate bounds kept from CROWN); the best bound seen per row is kept.

Operators (with a variable input): Conv, Gemm / MatMul with constant weights, Add / Sub / Mul /
Div by constants, Neg, Add / Sub of two variable branches (residual blocks), BatchNormalization
(inference), Relu, LeakyRelu, MaxPool, AveragePool, GlobalAveragePool, Flatten, Reshape,
Concat, Pad, Identity, Dropout (inference). Constant subgraphs (shapes and the like) are
evaluated concretely. Anything else raises :class:`BoundsUnavailable` naming the operator
(``certified: not available (operator X)``). A Softmax or LogSoftmax over the class axis that
writes the graph's output (and feeds nothing else) is left out (:attr:`BoundGraph.dropped`): it
keeps the order of each row, so a sample's answer is robust exactly when the margin of its input
is positive; the margins, and :meth:`BoundGraph.logits`, are then those of its input
(:meth:`BoundGraph.scores` applies it again).

MaxPool is relaxed soundly: intervals by monotonicity; linear bounds ``max ≥ x_j`` (``j`` the
window's input with the largest lower bound) and ``max ≤ max(u)`` over the window (a constant);
when ``l_j`` is at least every other input's upper bound, ``max = x_j`` exactly.

**Input set** (the threat model): the image ``x`` (``[B, C, H, W]`` float in ``[0, 1]``) and
``ε``; L∞: the box ``[x − ε, x + ε] ∩ [0, 1]`` (exact). L2: the ball ``‖x' − x‖₂ ≤ ε``
intersected with ``[0, 1]``; IBP uses the enclosing box ``[x − ε, x + ε] ∩ [0, 1]``, and a
linear bound ``A·x' + b`` is concretised as the larger (both are sound) of the ball's
``A·x − ε‖A‖₂ + b`` (dual norm, ignoring the pixel box) and the enclosing box's minimum.

**Preprocessing.** The graph's input is taken to be the ``[0, 1]`` image (NCHW). A model whose
normalisation lives outside the graph passes ``mean`` / ``std`` (per channel), or its whole
input convention as an :class:`InputMap` (luma, scale, mean/std, channel order, NHWC): the
first layer is then that affine map, folded into the linear bounds at the input. The graph is
evaluated at batch ``B`` (a graph written for a fixed batch of 1 takes one sample at a time).

All bounds are computed in float64; a sample is certified only when the lower bound of its
margin exceeds :data:`TOLERANCE` (:func:`certified`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx.numpy_helper
import torch

from certify.models.base import Preprocessing, preprocess
from certify.models.batching import opset_of
from certify.models.onnx_ops import Attrs, Op, op_for, tensor
from certify.norms import L2, LINF, Norm
from certify.norms import norm as norm_of

#: Bytes one backward pass's coefficients may take by default (:meth:`BoundGraph.bounds`).
MEMORY = 1 << 30
#: A margin's lower bound must exceed this to certify a sample (float64 bounds).
TOLERANCE = 1e-6
#: The methods, weakest first: each one's bounds are intersected with the previous one's.
METHODS = ("ibp", "crown", "alpha")

#: Operators whose output is nonlinear in a variable input (relaxed, with bounds of the input).
NONLINEAR = frozenset({"Relu", "LeakyRelu", "MaxPool"})
#: Affine operators of one variable input, backward through a vector-Jacobian product.
AFFINE = frozenset({"Conv", "Gemm", "MatMul", "BatchNormalization", "AveragePool",
                    "GlobalAveragePool", "Pad", "Add", "Sub", "Mul", "Div", "Neg"})
#: Operators that only move values of one variable input.
MOVES = frozenset({"Flatten", "Reshape", "Identity", "Dropout"})
SUPPORTED = NONLINEAR | AFFINE | MOVES | {"Concat"}


class InputMap:
    """The preprocessing from certify's ``[N, C, H, W]`` RGB image in ``[0, 1]`` to the graph's
    input (:func:`certify.models.base.preprocess`: luma for a grayscale model, scale, mean/std,
    channel order, layout), an affine map that never decreases a coordinate, so the image box's
    corners map to the input box's and a linear bound over the input pulls back exactly."""

    def __init__(self, pre: Preprocessing, channels: int, layout: str) -> None:
        if pre.input_scale <= 0 or any(v <= 0 for v in pre.std[:channels]):
            raise BoundsUnavailable("(preprocessing)", "a scale or std that is not positive")
        self.pre, self.channels, self.layout = pre, channels, layout

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return preprocess(x.to(torch.float64), self.pre, self.channels, self.layout)

    def pull(self, a: torch.Tensor, image: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
        """``a`` ``[B, S, *input]``, coefficients over the graph's input ``u = W·x + p``: the
        coefficients ``Wᵀ·a`` ``[B, S, *image]`` over the image and the offset ``a·p``
        ``[B, S]``."""
        b, s = a.shape[:2]
        offset = (a * self(torch.zeros((1, *image), dtype=torch.float64)).unsqueeze(1)
                  ).flatten(2).sum(2)
        c = self.channels
        if self.layout == "NHWC":
            a = a.permute(0, 1, 4, 2, 3)
        if self.pre.channel_order == "BGR" and c == 3:
            a = a.flip(2)
        if any(m != 0.0 for m in self.pre.mean) or any(v != 1.0 for v in self.pre.std):
            a = a / torch.tensor(self.pre.std[:c], dtype=a.dtype).view(1, 1, c, 1, 1)
        a = a * self.pre.input_scale
        if c == 1 and image[0] == 3:
            luma = torch.tensor([0.299, 0.587, 0.114], dtype=a.dtype).view(1, 1, 3, 1, 1)
            a = a * luma
        return a.reshape(b, s, *image), offset


class BudgetSpent(Exception):  # noqa: N818 - the time budget, not a failure
    """CROWN passed its deadline (:meth:`BoundGraph.bounds`): the samples keep their weaker
    method's bounds."""


class BoundsUnavailable(Exception):  # noqa: N818 - a reason, not a failure of certify
    """Why a graph has no certified bounds: :attr:`operator` is the operator it cannot
    bound (``certified: not available (operator X)``), or, in parentheses, what else stands in
    the way (``certified: not available (format)``, ``(agreement)``, ``(preprocessing)``)."""

    def __init__(self, operator: str, detail: str = "") -> None:
        self.operator = operator
        self.detail = detail
        what = operator if operator.startswith("(") else f"(operator {operator})"
        super().__init__(f"certified: not available {what}" + (f": {detail}" if detail else ""))


@dataclass(frozen=True)
class NodeSpec:
    """One operator of the table as a front end writes it: the ONNX operator type, the names of
    its input tensors (``""`` for an omitted optional input) and output tensors, its ONNX
    attributes, a label, and ``origin``: the front end's own name of the operation, which
    :class:`BoundsUnavailable` names when the table cannot bound it (``""``: ``op_type``)."""

    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: Attrs
    label: str = ""
    origin: str = ""


@dataclass
class _Node:
    op_type: str
    op: Op
    inputs: list[str]
    outputs: list[str]
    attrs: Attrs
    label: str
    #: which inputs depend on the graph's input
    variable: list[bool] = field(default_factory=list)


Bounds = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Result:
    """Lower bounds of ``min_{j≠y} (z_y − z_j)`` per method (``[B]``), the per-row bounds
    (``[B, K−1]``, rows ``j ≠ y`` in class order) and the bounds of every nonlinear node's
    input that CROWN used (by the input tensor's name, in graph order)."""

    margins: dict[str, torch.Tensor]
    rows: dict[str, torch.Tensor]
    pre_bounds: dict[str, Bounds]


class BoundGraph:
    """A classifier's graph as the operator table, read once, ready to bound (see the module
    docstring).

    ``model``: an ``onnx.ModelProto`` or a path. ``mean`` / ``std``: the normalisation applied
    before the graph (per channel), if it is outside the graph; ``input_map``: the model's whole
    preprocessing (:class:`InputMap`, instead of ``mean`` / ``std``). Another front end builds
    the same table with :meth:`from_table` (:func:`certify.models.bound_fx.fx_bound_graph`)."""

    def __init__(self, model: onnx.ModelProto | str | Path,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 max_crown_neurons: int = 4096, *, input_map: InputMap | None = None
                 ) -> None:
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
        graph = proto.graph
        inits = {i.name for i in graph.initializer}
        constants = {i.name: tensor(onnx.numpy_helper.to_array(i)) for i in graph.initializer}
        if input_map is None and (mean is not None or std is not None):
            c = len(mean if mean is not None else std)  # type: ignore[arg-type]
            input_map = InputMap(Preprocessing(
                mean=tuple(mean) if mean is not None else (0.0,) * c,
                std=tuple(std) if std is not None else (1.0,) * c), c, "NCHW")
        specs = [NodeSpec(n.op_type, list(n.input), list(n.output),
                          {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute},
                          n.name or n.op_type) for n in graph.node]
        self._build(specs, constants, next(i.name for i in graph.input if i.name not in inits),
                    graph.output[0].name, opset_of(proto), input_map, max_crown_neurons)

    @classmethod
    def from_table(cls, specs: Sequence[NodeSpec], constants: dict[str, torch.Tensor],
                   input_name: str, output_name: str, *, opset: int = 17,
                   input_map: InputMap | None = None, max_crown_neurons: int = 4096
                   ) -> BoundGraph:
        """The graph of an operator table another front end wrote: ``specs`` in a topological
        order (ONNX operator types and attributes at ``opset``), ``constants`` by name, the
        input tensor's and the output tensor's names."""
        graph = cls.__new__(cls)
        graph._build(specs, constants, input_name, output_name, opset, input_map,
                     max_crown_neurons)
        return graph

    def _build(self, specs: Sequence[NodeSpec], constants: dict[str, torch.Tensor],
               input_name: str, output_name: str, opset: int, input_map: InputMap | None,
               max_crown_neurons: int) -> None:
        self.input_name, self.output_name = input_name, output_name
        self.constants: dict[str, torch.Tensor] = {k: _f64(v) for k, v in constants.items()}
        self.input_map = input_map
        self.max_crown_neurons = max_crown_neurons
        specs = list(specs)
        #: the final Softmax / LogSoftmax left out of the bounds (its input is the output)
        self.dropped: _Node | None = None
        last = _final_softmax(specs, output_name)
        if last is not None:
            spec = specs.pop(last)
            self.output_name = spec.inputs[0]
            self.dropped = _Node(spec.op_type, op_for(spec.op_type, opset), spec.inputs,
                                 spec.outputs, spec.attrs, spec.label or spec.op_type)
        variable = {input_name}
        self.nodes: list[_Node] = []
        for s in specs:
            try:
                op = op_for(s.op_type, opset)
            except Exception:  # noqa: BLE001 - an operator the converter does not know
                op = None
            flags = [i in variable for i in s.inputs]
            try:
                if any(flags):
                    _check(s.op_type, flags, s.attrs, s.outputs)
                if op is None:
                    raise BoundsUnavailable(s.op_type, "no converter for it")
            except BoundsUnavailable as exc:
                if not s.origin:
                    raise
                raise BoundsUnavailable(s.origin, f"as {exc.operator}" + (
                    f", {exc.detail}" if exc.detail else "")) from None
            node = _Node(s.op_type, op, list(s.inputs), list(s.outputs), s.attrs,
                         s.label or s.op_type, flags)
            if any(flags) and s.op_type != "Shape":
                variable.update(o for o in s.outputs if o)
            self.nodes.append(node)
        if self.output_name not in variable:
            raise BoundsUnavailable("(output)", "it does not depend on the input")
        self.variable = variable

    # -- concrete values ------------------------------------------------------------------
    def _model_input(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.input_map is None else self.input_map(x)

    def concrete(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every tensor of the graph at the image batch ``x`` (float64)."""
        return self.evaluate(self._model_input(x.to(torch.float64)))

    def evaluate(self, u: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every tensor of the graph at its own input ``u`` (the preprocessed batch; float64)."""
        env = dict(self.constants)
        env[self.input_name] = _f64(u)
        for n in self.nodes:
            outs = n.op([env[i] if i else None for i in n.inputs], n.attrs)
            for name, v in zip(n.outputs, outs, strict=False):
                if name:
                    env[name] = _f64(v)
        return env

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The bounded output at ``x`` (float64), for checks: the graph's output, or the input
        of its final Softmax / LogSoftmax where that was left out (:attr:`dropped`)."""
        return self.concrete(x)[self.output_name]

    @property
    def head(self) -> str | None:
        """The operator type of the final Softmax / LogSoftmax left out (:attr:`dropped`), or
        ``None``."""
        return None if self.dropped is None else self.dropped.op_type

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """The graph's own output at ``x`` (float64): :meth:`logits` with the final Softmax /
        LogSoftmax applied again where it was left out (to compare with the model's answers)."""
        z = self.logits(x)
        return z if self.dropped is None else _f64(self.dropped.op([z], self.dropped.attrs)[0])

    # -- bounds ---------------------------------------------------------------------------
    def bounds(self, x: torch.Tensor, y: torch.Tensor, norm: Norm | str, eps: float,
               methods: Iterable[str] = METHODS, alpha_steps: int = 30,
               alpha_lr: float = 0.1, deadline: float | None = None,
               memory: int = MEMORY, enough: float | None = None) -> Result:
        """Lower bounds of each sample's margin over the threat model's set (module
        docstring). ``x`` ``[B, C, H, W]`` in ``[0, 1]``, ``y`` ``[B]`` the true classes.

        ``deadline`` (``time.monotonic()``): CROWN raises :class:`BudgetSpent` when it passes
        it, α-CROWN stops its steps there (its best bound so far is kept: as sound).
        ``memory``: bytes one backward pass's coefficients may take; CROWN's intermediate
        bounds are computed in chunks of rows that fit. ``enough``: α-CROWN is skipped when
        every sample's CROWN margin already exceeds it (its bound is then CROWN's)."""
        methods = [m for m in METHODS if m in set(methods)]
        nm = norm_of(norm)
        if nm not in (LINF, L2):
            raise ValueError(f"certified bounds cover the linf and l2 balls, not {nm.name}")
        x = x.detach().to(torch.float64)
        env = self.concrete(x)
        run = _Run(self, env, x, nm, float(eps))
        run.deadline, run.memory = deadline, memory
        logits = env[self.output_name]
        if logits.dim() != 2 or logits.shape[0] != x.shape[0]:
            raise BoundsUnavailable("(output)", f"output shape {tuple(logits.shape)} is not "
                                                "[batch, classes]")
        c = _spec(y.to(torch.long), logits.shape[1])
        rows: dict[str, torch.Tensor] = {}
        run.forward(crown=False)
        best = run.spec_ibp(c)
        if "ibp" in methods:
            rows["ibp"] = best
        if "crown" in methods or "alpha" in methods:
            run.forward(crown=True)
            with torch.no_grad():
                crown = run.backward(self.output_name, c)
            best = torch.maximum(best, crown)
            if "crown" in methods:
                rows["crown"] = best
        if "alpha" in methods and (enough is None or not bool(
                (best.min(dim=1).values > enough).all() if best.shape[1] else True)):
            best = torch.maximum(best, run.optimise(c, alpha_steps, alpha_lr))
        if "alpha" in methods:
            rows["alpha"] = best
        margins = {m: r.min(dim=1).values if r.shape[1] else
                   torch.full((r.shape[0],), float("inf"), dtype=r.dtype)
                   for m, r in rows.items()}
        pre = {n.inputs[0]: run.bounds[n.inputs[0]] for n in self.nodes
               if n.op_type in NONLINEAR and n.inputs[0] in run.bounds}
        return Result(margins, rows, pre)


def certify_margins(model: onnx.ModelProto | str | Path | BoundGraph, x: torch.Tensor,
                    y: torch.Tensor, norm: Norm | str, eps: float,
                    methods: Iterable[str] = METHODS, **kw: object) -> dict[str, torch.Tensor]:
    """Lower bounds ``[B]`` of ``min_{j≠y} (z_y − z_j)`` over the threat model's set, per
    method (see the module docstring); ordered ibp ≤ crown ≤ alpha by construction."""
    graph = model if isinstance(model, BoundGraph) else BoundGraph(model)
    return graph.bounds(x, y, norm, eps, methods, **kw).margins  # type: ignore[arg-type]


def certified(margins: dict[str, torch.Tensor], tolerance: float = TOLERANCE
              ) -> dict[str, torch.Tensor]:
    """Which samples each method certifies (``[B]`` bool): lower bound above ``tolerance``."""
    return {m: v > tolerance for m, v in margins.items()}


# -- internals ------------------------------------------------------------------------------

def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float64) if t.is_floating_point() else t


def _check(op_type: str, flags: list[bool], attrs: Attrs, outputs: list[str]) -> None:
    """Refuse a node with a variable input that the table cannot bound."""
    if op_type == "Shape":
        return
    if op_type not in SUPPORTED:
        raise BoundsUnavailable(op_type)
    if op_type in ("Conv", "Gemm", "MatMul", "BatchNormalization", "Pad", "Reshape",
                   "Div") and any(flags[1:]):
        raise BoundsUnavailable(op_type, "a variable weight or parameter")
    if op_type == "Gemm" and int(attrs.get("transA", 0)):
        raise BoundsUnavailable(op_type, "transA on the variable input")
    if op_type in ("Mul",) and all(flags):
        raise BoundsUnavailable(op_type, "a product of two variable tensors")
    if op_type in ("Conv", "Gemm", "MatMul", "BatchNormalization", "Div") and not flags[0]:
        raise BoundsUnavailable(op_type, "the variable input is not the first")
    if op_type == "BatchNormalization" and int(attrs.get("training_mode", 0)):
        raise BoundsUnavailable(op_type, "training mode")
    if op_type in ("MaxPool", "Dropout") and len([o for o in outputs if o]) > 1:
        raise BoundsUnavailable(op_type, "a second output")
    if op_type == "LeakyRelu" and not 0.0 <= float(attrs.get("alpha", 0.01)) <= 1.0:
        raise BoundsUnavailable(op_type, "a negative-side slope outside [0, 1] (not monotone, "
                                         "or concave)")


def _windows_overlap(attrs: Attrs) -> bool:
    """Whether a pooling's windows share inputs (a kernel wider than its stride, or dilated)."""
    kernel = list(attrs.get("kernel_shape", []))
    strides = list(attrs.get("strides", [1] * len(kernel)))
    dilations = list(attrs.get("dilations", [1] * len(kernel)))
    return any(d != 1 for d in dilations) or \
        any(k > s for k, s in zip(kernel, strides, strict=False))


def _final_softmax(specs: list[NodeSpec], output_name: str) -> int | None:
    """The index of the Softmax / LogSoftmax over the class axis that writes the graph's
    output and feeds nothing else (left out of the bounds: it keeps each row's order)."""
    at = next((k for k, s in enumerate(specs) if output_name in s.outputs), None)
    if at is None or specs[at].op_type not in ("Softmax", "LogSoftmax"):
        return None
    spec = specs[at]
    if int(spec.attrs.get("axis", -1)) not in (1, -1) or len(spec.inputs) != 1 or \
            any(o in s.inputs for s in specs for o in spec.outputs if o):
        return None
    return at


def _spec(y: torch.Tensor, k: int) -> torch.Tensor:
    """``C`` ``[B, K−1, K]``: rows ``e_y − e_j`` for ``j ≠ y`` in class order."""
    b = y.shape[0]
    eye = torch.eye(k, dtype=torch.float64)
    others = torch.stack([torch.tensor([j for j in range(k) if j != int(t)], dtype=torch.long)
                          for t in y]) if k > 1 else torch.zeros((b, 0), dtype=torch.long)
    return eye[y].unsqueeze(1) - eye[others]


def _relu_lines(op_type: str, attrs: Attrs, lo: torch.Tensor, hi: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """Upper line (slope, intercept), default lower slope, the unstable mask and the
    negative-side slope of a (leaky) ReLU with input bounds ``[lo, hi]``."""
    s = float(attrs.get("alpha", 0.01)) if op_type == "LeakyRelu" else 0.0
    if s > 1:
        raise BoundsUnavailable(op_type, "a negative-side slope above 1 (concave)")
    unstable = (lo < 0) & (hi > 0)
    width = torch.where(unstable, hi - lo, torch.ones_like(hi))
    up_s = torch.where(unstable, (hi - s * lo) / width,
                       torch.where(hi <= 0, torch.full_like(hi, s), torch.ones_like(hi)))
    up_b = torch.where(unstable, s * lo - up_s * lo, torch.zeros_like(hi))
    default = torch.where(hi > -lo, torch.ones_like(hi), torch.full_like(hi, s))
    return up_s, up_b, default, unstable, s


class _Run:
    """One evaluation of the bounds on a batch: the concrete tensors, the input set, the
    intervals of every variable tensor, the lower slopes."""

    def __init__(self, g: BoundGraph, env: dict[str, torch.Tensor], x: torch.Tensor,
                 nm: Norm, eps: float) -> None:
        self.g, self.env, self.x, self.norm, self.eps = g, env, x, nm, eps
        self.batch = x.shape[0]
        self.box = ((x - eps).clamp(min=0.0), (x + eps).clamp(max=1.0))
        self.bounds: dict[str, Bounds] = {}
        self.alphas: dict[str, torch.Tensor] = {}
        self.deadline: float | None = None
        self.memory = MEMORY
        #: the most values per sample of any tensor (a backward pass's widest coefficients)
        self.widest = max([t[0].numel() for t in env.values()
                           if t.dim() and t.shape[0] == self.batch] + [x[0].numel()])

    def _in_time(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise BudgetSpent

    # interval bounds -------------------------------------------------------------------
    def forward(self, crown: bool) -> None:
        g = self.g
        lo, hi = self.box
        self.bounds = {g.input_name: (g._model_input(lo), g._model_input(hi))}
        consumers_nonlinear = {n.inputs[0] for n in g.nodes if n.op_type in NONLINEAR}
        #: inputs only ReLUs read: CROWN refines just their unstable values (a stable ReLU's
        #: relaxation is exact whatever its bounds)
        relu_only = consumers_nonlinear - {i for n in g.nodes if n.op_type not in
                                           ("Relu", "LeakyRelu") for i in n.inputs}
        for n in g.nodes:
            if not any(n.variable) or n.op_type == "Shape":
                continue
            out = n.outputs[0]
            b = self._ibp(n)
            if crown and out in consumers_nonlinear and \
                    b[0][0].numel() <= g.max_crown_neurons:
                b = self._refine(out, b, out in relu_only)
            self.bounds[out] = b

    def _refine(self, out: str, b: Bounds, unstable_only: bool) -> Bounds:
        """The interval ``b`` of tensor ``out`` intersected with CROWN's bounds of its values
        (only those whose interval crosses zero where ``unstable_only``)."""
        lo, hi = b[0].flatten(1), b[1].flatten(1)
        k = lo.shape[1]
        rows = ((lo < 0) & (hi > 0)).any(0).nonzero().flatten() if unstable_only \
            else torch.arange(k)
        if not len(rows):
            return b
        lo, hi = lo.clone(), hi.clone()
        # rows per backward pass: two coefficient tensors of the widest size must fit
        step = max(1, self.memory // (2 * 8 * 2 * self.batch * self.widest))
        for start in range(0, len(rows), step):
            self._in_time()
            part = rows[start:start + step]
            r = len(part)
            eye = torch.zeros((r, k), dtype=torch.float64)
            eye[torch.arange(r), part] = 1.0
            eye = eye.reshape(r, *b[0].shape[1:])
            c = torch.cat([eye, -eye]).unsqueeze(0).expand(self.batch, *[-1] * eye.dim())
            with torch.no_grad():
                lb = self.backward(out, c, intermediate=True)
            lo[:, part] = torch.maximum(lo[:, part], lb[:, :r])
            hi[:, part] = torch.minimum(hi[:, part], -lb[:, r:])
        hi = torch.maximum(hi, lo)
        return lo.reshape(b[0].shape), hi.reshape(b[1].shape)

    def spec_ibp(self, c: torch.Tensor) -> torch.Tensor:
        """IBP's lower bounds ``[B, S]`` of ``c · output``: from the output's interval, and,
        where the output is a Gemm / MatMul of one variable input, also with ``c`` folded into
        that layer and concretised over its input's interval (the elision of Gowal et al.
        2018: much tighter, as sound); the larger of the two."""
        out = self.g.output_name
        lo, hi = self.bounds[out]
        best = torch.einsum("bsk,bk->bs", c.clamp(min=0), lo) + \
            torch.einsum("bsk,bk->bs", c.clamp(max=0), hi)
        last = next((n for n in self.g.nodes if out in n.outputs), None)
        if last is None or last.op_type not in ("Gemm", "MatMul") or sum(last.variable) != 1:
            return best
        with torch.no_grad():
            name, a_in, extra = self._back_affine(last, c)
        if name is None or a_in is None or name not in self.bounds:
            return best
        l_in, h_in = (t.unsqueeze(1) for t in self.bounds[name])
        folded = (a_in.clamp(min=0) * l_in + a_in.clamp(max=0) * h_in).flatten(2).sum(2)
        if extra is not None:
            folded = folded + extra
        return torch.maximum(best, folded)

    def _arg(self, n: _Node, k: int) -> torch.Tensor | None:
        name = n.inputs[k] if k < len(n.inputs) else ""
        return self.env[name] if name else None

    def _ibp(self, n: _Node) -> Bounds:
        t, attrs = n.op_type, n.attrs
        args = [self._arg(n, k) for k in range(len(n.inputs))]

        def var(k: int) -> Bounds:
            return self.bounds[n.inputs[k]]

        if t in ("Relu", "LeakyRelu", "MaxPool", "AveragePool", "GlobalAveragePool",
                 "Identity", "Dropout") or (t == "Pad" and _pad_mode(attrs) != "constant"):
            lo, hi = var(0)
            return (n.op([lo, *args[1:]], attrs)[0], n.op([hi, *args[1:]], attrs)[0])
        if t in ("Flatten", "Reshape"):
            shape = self._same_batch(n)
            lo, hi = var(0)
            return lo.reshape(shape), hi.reshape(shape)
        if t == "Concat":
            parts = [var(k) if f else (self.env[i], self.env[i])
                     for k, (i, f) in enumerate(zip(n.inputs, n.variable, strict=True))]
            axis = int(attrs["axis"])
            return (torch.cat([p[0] for p in parts], axis), torch.cat([p[1] for p in parts], axis))
        if t == "Neg":
            lo, hi = var(0)
            return -hi, -lo
        if t in ("Add", "Sub") and all(n.variable):
            (l1, u1), (l2, u2) = var(0), var(1)
            return (l1 + l2, u1 + u2) if t == "Add" else (l1 - u2, u1 - l2)
        # affine in one variable input: centre through the operator, radius through |W|
        k = n.variable.index(True)
        lo, hi = var(k)
        mid, rad = (lo + hi) / 2, (hi - lo) / 2
        margs = list(args)
        margs[k] = mid
        centre = n.op(margs, attrs)[0]
        rargs = list(args)
        rargs[k] = rad
        rattrs = dict(attrs)
        if t == "Conv":
            rargs[1] = _need(args[1]).abs()
            rargs = rargs[:2]
        elif t == "Gemm":
            rargs[1] = _need(args[1]).abs()
            rargs = rargs[:2]
            rattrs["alpha"] = abs(float(attrs.get("alpha", 1.0)))
        elif t == "MatMul":
            rargs[1] = _need(args[1]).abs()
        elif t == "BatchNormalization":
            scale, _, _, v = (_need(a) for a in args[1:5])
            rargs = [rad, scale.abs(), torch.zeros_like(scale), torch.zeros_like(scale), v]
        elif t == "Mul":
            rargs[1 - k] = _need(args[1 - k]).abs()
        elif t == "Div":
            rargs[1] = _need(args[1]).abs()
        elif t in ("Add", "Sub"):
            return centre - rad.expand_as(centre), centre + rad.expand_as(centre)
        elif t == "Pad":
            if len(rargs) > 2 and rargs[2] is not None:
                rargs[2] = torch.zeros_like(rargs[2])
            rattrs["value"] = 0.0
        radius = n.op(rargs, rattrs)[0]
        return centre - radius, centre + radius

    def _same_batch(self, n: _Node) -> list[int]:
        shape = list(self.env[n.outputs[0]].shape)
        if not shape or shape[0] != self.batch:
            raise BoundsUnavailable(n.op_type, "it mixes the batch axis")
        return shape

    # linear bounds ---------------------------------------------------------------------
    def backward(self, target: str, c: torch.Tensor, intermediate: bool = False
                 ) -> torch.Tensor:
        """Lower bounds ``[B, S]`` of ``c · target`` over the input set, ``c`` ``[B, S,
        *shape]`` (CROWN; the lower slopes from :attr:`alphas` where set)."""
        b, s = c.shape[0], c.shape[1]
        acc: dict[str, torch.Tensor] = {target: c}
        bias = torch.zeros((b, s), dtype=torch.float64)
        end = next(k for k, n in enumerate(self.g.nodes) if target in n.outputs)
        for n in reversed(self.g.nodes[:end + 1]):
            if not n.outputs or n.outputs[0] not in acc:
                continue
            self._in_time()
            a = acc.pop(n.outputs[0])
            for name, a_in, extra in self._back(n, a, intermediate):
                if extra is not None:
                    bias = bias + extra
                if name is not None and a_in is not None:
                    acc[name] = acc[name] + a_in if name in acc else a_in
        a = acc.pop(self.g.input_name)
        if self.g.input_map is not None:  # fold the preprocessing into the image's coefficients
            a, offset = self.g.input_map.pull(a, self.x.shape[1:])
            bias = bias + offset
        return bias + self._concretise(a)

    def _concretise(self, a: torch.Tensor) -> torch.Tensor:
        lo, hi = (t.unsqueeze(1) for t in self.box)
        box = (a.clamp(min=0) * lo + a.clamp(max=0) * hi).flatten(2).sum(2)
        if self.norm is LINF:
            return box
        centre = (a * self.x.unsqueeze(1)).flatten(2).sum(2)
        ball = centre - self.eps * a.flatten(2).norm(dim=2)
        return torch.maximum(box, ball)

    def _back(self, n: _Node, a: torch.Tensor, intermediate: bool
              ) -> list[tuple[str | None, torch.Tensor | None, torch.Tensor | None]]:
        t, attrs = n.op_type, n.attrs
        b, s = a.shape[0], a.shape[1]
        src = n.inputs[0]
        if t in ("Relu", "LeakyRelu"):
            lo, hi = self.bounds[src]
            up_s, up_b, default, unstable, neg = _relu_lines(t, attrs, lo, hi)
            alpha = None if intermediate else self.alphas.get(n.outputs[0])
            low_s = torch.where(unstable, default, up_s)
            low_s = low_s.unsqueeze(1)
            if alpha is not None:
                low_s = torch.where(unstable.unsqueeze(1), alpha.clamp(neg, 1.0), low_s)
            pos, negs = a.clamp(min=0), a.clamp(max=0)
            a_in = pos * low_s + negs * up_s.unsqueeze(1)
            extra = (negs * up_b.unsqueeze(1)).flatten(2).sum(2)
            return [(src, a_in, extra)]
        if t == "MaxPool":
            a_pool, extra_pool = self._back_maxpool(n, a)
            return [(src, a_pool, extra_pool)]
        if t in ("Identity", "Dropout"):
            return [(src, a, None)]
        if t in ("Flatten", "Reshape"):
            shape = self.env[src].shape
            return [(src, a.reshape(b, s, *shape[1:]), None)]
        if t == "Concat":
            axis = int(attrs["axis"]) % self.env[n.outputs[0]].dim()
            sizes = [self.env[i].shape[axis] for i in n.inputs]
            parts = torch.split(a, sizes, dim=axis + 1)
            out: list[tuple[str | None, torch.Tensor | None, torch.Tensor | None]] = []
            for i, f, p in zip(n.inputs, n.variable, parts, strict=True):
                if f:
                    out.append((i, p, None))
                else:
                    out.append((None, None, (p * self.env[i].unsqueeze(1)).flatten(2).sum(2)))
            return out
        if t in ("Add", "Sub") and all(n.variable):
            return [(n.inputs[0], a, None), (n.inputs[1], a if t == "Add" else -a, None)]
        return [self._back_affine(n, a)]

    def _back_affine(self, n: _Node, a: torch.Tensor
                     ) -> tuple[str | None, torch.Tensor | None, torch.Tensor | None]:
        """``a · f(z) = (aJ) · z + a · f(0)`` for an affine ``f``: ``aJ`` by a vector-Jacobian
        product at a batch of ``B·S`` zero inputs."""
        b, s = a.shape[0], a.shape[1]
        k = n.variable.index(True)
        src = n.inputs[k]
        in_shape = self.env[src].shape[1:]
        args = [self._arg(n, j) for j in range(len(n.inputs))]
        constants = list(args)

        def f(z: torch.Tensor) -> torch.Tensor:
            full = list(constants)
            full[k] = z
            return n.op(full, n.attrs)[0]

        zero = torch.zeros((b * s, *in_shape), dtype=torch.float64)
        pair = torch.func.vjp(f, zero)
        f0, vjp = pair[0], pair[1]
        flat = a.reshape(b * s, *a.shape[2:])
        if f0.shape != flat.shape:
            raise BoundsUnavailable(n.op_type, f"output shape {tuple(f0.shape)} is not "
                                               "per sample")
        (a_in,) = vjp(flat)
        extra = (flat * f0).reshape(b, s, -1).sum(2)
        return src, a_in.reshape(b, s, *in_shape), extra

    def _back_maxpool(self, n: _Node, a: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        src = n.inputs[0]
        lo, hi = self.bounds[src]
        attrs = {**n.attrs, "storage_order": 0}
        low_max, idx = n.op([lo], attrs)[:2]
        up_max = n.op([hi], attrs)[0]
        b, s = a.shape[0], a.shape[1]
        per = lo[0].numel()
        idx = idx - torch.arange(b).reshape(b, *[1] * (idx.dim() - 1)) * per
        # exact where the input with the largest lower bound dominates its window: the
        # largest upper bound of the others is below its lower bound. Masking each window's
        # chosen input in one shared tensor is right only where windows do not overlap (an
        # overlapping window would lose a neighbour's chosen input): elsewhere, no window is
        # taken as exact (the relaxation stays sound)
        if _windows_overlap(attrs):
            exact = torch.zeros((b, 1, *low_max.shape[1:]), dtype=torch.bool)
        else:
            hi_masked = hi.flatten(1).scatter(1, idx.flatten(1), float("-inf")
                                              ).reshape(hi.shape)
            others_up = n.op([hi_masked], attrs)[0]
            exact = (others_up <= low_max).unsqueeze(1)
        pos, neg = a.clamp(min=0), a.clamp(max=0)
        moved = torch.where(exact, a, pos).flatten(2)
        a_in = torch.zeros((b, s, per), dtype=torch.float64)
        a_in = a_in.scatter_add(2, idx.flatten(1).unsqueeze(1).expand(b, s, -1), moved)
        extra = torch.where(exact, torch.zeros_like(neg), neg * up_max.unsqueeze(1))
        return a_in.reshape(b, s, *lo.shape[1:]), extra.flatten(2).sum(2)

    # α-CROWN -----------------------------------------------------------------------------
    def optimise(self, c: torch.Tensor, steps: int, lr: float) -> torch.Tensor:
        """The best final lower bounds ``[B, S]`` over ``steps`` Adam steps on the slopes."""
        s = c.shape[1]
        params = []
        for n in self.g.nodes:
            if n.op_type in ("Relu", "LeakyRelu") and n.inputs[0] in self.bounds:
                lo, hi = self.bounds[n.inputs[0]]
                _, _, default, _, _ = _relu_lines(n.op_type, n.attrs, lo, hi)
                p = default.unsqueeze(1).expand(-1, s, *[-1] * (lo.dim() - 1)).clone()
                p.requires_grad_(True)
                self.alphas[n.outputs[0]] = p
                params.append((p, float(n.attrs.get("alpha", 0.01))
                               if n.op_type == "LeakyRelu" else 0.0))
        with torch.no_grad():
            best = self.backward(self.g.output_name, c)
        if not params or steps <= 0:
            return best
        opt = torch.optim.Adam([p for p, _ in params], lr=lr)
        for _ in range(steps):
            if self.deadline is not None and time.monotonic() > self.deadline:
                break  # the best bound so far stands (every step's bound is sound)
            lb = self.backward(self.g.output_name, c)
            best = torch.maximum(best, lb.detach())
            opt.zero_grad()
            (-lb.sum()).backward()
            opt.step()
            with torch.no_grad():
                for p, low in params:
                    p.clamp_(low, 1.0)
        self.deadline = None  # the last pass ends what was started: its bound is kept
        with torch.no_grad():
            best = torch.maximum(best, self.backward(self.g.output_name, c))
        self.alphas.clear()
        return best


def _need(t: torch.Tensor | None) -> torch.Tensor:
    if t is None:
        raise ValueError("a required input is missing")
    return t


def _pad_mode(attrs: Attrs) -> str:
    v = attrs.get("mode", b"constant")
    return v.decode() if isinstance(v, bytes) else str(v)
