"""Is a graph exported at batch 1 safe to run on a batch of images? A proof, not a sample.

``torch.onnx.export`` writes a graph for the example batch it was given, by default one image:
the input says ``[1, C, H, W]`` and a ``Reshape`` may say ``[1, 1024]``. Such a graph is
correct for one image at a time. Running it on batches is much faster, but only where every
image's answer stays its own: a graph that normalises by the mean over the whole input tensor,
or reshapes the batch into another axis, is legal at batch 1 and wrong on a batch.

:func:`prove_symbolic_batch` rewrites the batch dimension as a symbol (and the leading ``1`` or
``-1`` of every constant ``Reshape`` shape on the image's path as ``0``, "copy the batch") and
then proves the rewrite from ONNX's own shape inference: every tensor that depends on the image
must keep the symbolic batch as its leading dimension, and every operation on such a tensor
must act per sample (:data:`PER_SAMPLE` and the attribute rules of :func:`_mixes`: no
reduction, softmax, concatenation, transposition or contraction over axis 0). Anything it
cannot show is a refusal with the reason: the model then runs at its fixed batch (onnxruntime
chunked, the torch copy mapped over single images with ``torch.func.vmap``). The caller also
compares real images alone and inside batches of different make-up
(:func:`same_alone_and_batched`) before it uses the rewrite.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper

#: The name of the symbolic batch dimension in a rewritten graph.
BATCH_PARAM = "certify_batch"

#: Operations that act on each sample alone whatever their attributes (element-wise maps,
#: broadcasting arithmetic, convolutions and pooling over the spatial axes, inference-mode
#: normalisation with stored statistics).
PER_SAMPLE = frozenset({
    "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh", "AveragePool",
    "BatchNormalization", "BitShift", "Cast", "CastLike", "Ceil", "Celu", "Clip", "Conv",
    "ConvTranspose", "Cos", "Cosh", "DepthToSpace", "DequantizeLinear", "Div", "Dropout", "Elu",
    "Equal", "Erf", "Exp", "Floor", "Gelu", "GlobalAveragePool", "GlobalLpPool",
    "GlobalMaxPool", "Greater", "GreaterOrEqual", "HardSigmoid", "HardSwish", "Identity",
    "InstanceNormalization", "IsInf", "IsNaN", "LRN", "LeakyRelu", "Less", "LessOrEqual", "Log",
    "LpPool", "Max", "MaxPool", "Mean", "Min", "Mish", "Mod", "Mul", "Neg", "Not", "Or",
    "PRelu", "Pow", "QuantizeLinear", "Reciprocal", "Relu", "Round", "Selu", "Shrink",
    "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "SpaceToDepth", "Sqrt", "Sub",
    "Sum", "Tan", "Tanh", "ThresholdedRelu", "Where", "Xor",
})
#: Operations that read only the shape of their input: their outputs are not image data.
SHAPE_ONLY = frozenset({"Shape", "Size"})
#: Reductions over ``axes`` (an attribute, or the second input from opset 18; ReduceSum from 13).
REDUCTIONS = frozenset({"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax",
                        "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum",
                        "ReduceSumSquare"})
_INT64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class BatchProof:
    """The outcome of :func:`prove_symbolic_batch`: the rewritten graph where the proof holds
    (``model``), else ``None`` and why not (``why``); ``reshapes`` counts the ``Reshape``
    shapes rewritten to copy the batch."""

    model: onnx.ModelProto | None
    why: str | None
    reshapes: int = 0

    @property
    def ok(self) -> bool:
        """Whether the graph was proven to act on each sample of a batch alone."""
        return self.model is not None


def opset_of(proto: onnx.ModelProto) -> int:
    """The graph's version of the default ONNX domain (1 when it does not say)."""
    return next((int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Every tensor whose value the graph states: initializers and ``Constant`` outputs."""
    out = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute:
            attr = node.attribute[0]
            if attr.name == "value":
                out[node.output[0]] = onnx.numpy_helper.to_array(attr.t)
            elif attr.name in ("value_int", "value_ints", "value_float", "value_floats"):
                out[node.output[0]] = np.array(onnx.helper.get_attribute_value(attr))
    return out


def image_path(graph: onnx.GraphProto, image: str) -> set[str]:
    """The tensors that carry the image's data: the input and everything computed from it,
    except through operations that read only its shape (``Shape``, ``Size``)."""
    carried = {image}
    for node in graph.node:  # stored in topological order
        if node.op_type in SHAPE_ONLY:
            continue
        if any(i in carried for i in node.input if i):
            carried.update(o for o in node.output if o)
    return carried


def _shape(value: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """A value's inferred dimensions (int, symbol or ``None`` unknown), or None without rank."""
    t = value.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None)
            for d in t.shape.dim]


def _shapes(model: onnx.ModelProto, strict: bool) -> dict[str, list[int | str | None] | None]:
    inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=strict,
                                                 data_prop=True)
    g = inferred.graph
    return {v.name: _shape(v) for v in (*g.value_info, *g.input, *g.output)}


def _set_batch(value: onnx.ValueInfoProto) -> None:
    shape = value.type.tensor_type.shape
    if len(shape.dim) and shape.dim[0].HasField("dim_value") and shape.dim[0].dim_value == 1:
        shape.dim[0].Clear()
        shape.dim[0].dim_param = BATCH_PARAM


def prove_symbolic_batch(proto: onnx.ModelProto) -> BatchProof:
    """The graph with its batch of 1 made symbolic, where that provably changes no image's
    answer (see the module's docstring); else why not."""
    graph = proto.graph
    initializers = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    if len(inputs) != 1:
        return BatchProof(None, f"the graph has {len(inputs)} inputs")
    image = inputs[0].name
    if any(n.domain not in ("", "ai.onnx") for n in graph.node):
        return BatchProof(None, "the graph uses operations outside the ONNX domain")
    carried = image_path(graph, image)
    try:
        fixed = _shapes(proto, strict=False)
    except Exception as exc:  # noqa: BLE001 - ONNX's inference refuses the graph itself
        return BatchProof(None, f"ONNX shape inference fails on the graph ({first_line(exc)})")
    m = onnx.ModelProto()
    m.CopyFrom(proto)
    for value in (*m.graph.input, *m.graph.output):
        if value.name not in initializers:
            _set_batch(value)
    del m.graph.value_info[:]  # shapes recorded at export say 1: inferred again below
    consts = _constants(m.graph)
    reshapes = 0
    for k, node in enumerate(m.graph.node):
        if node.op_type != "Reshape" or node.input[0] not in carried or len(node.input) < 2:
            continue
        shape = consts.get(node.input[1])
        before = fixed.get(node.input[0])
        if shape is None or shape.ndim != 1 or not shape.size or not before \
                or before[0] != 1 or int(shape[0]) not in (1, -1):
            continue
        allowzero = any(a.name == "allowzero" and a.i for a in node.attribute)
        if allowzero and 0 in shape[1:]:
            continue
        new = shape.astype(np.int64).copy()
        new[0] = 0  # copy the input's leading dimension: the batch
        # allowzero (the dynamo exporter sets it) reads a 0 literally; the shape has no other 0
        for a in [a for a in node.attribute if a.name == "allowzero"]:
            node.attribute.remove(a)
        name = f"certify_batch_shape_{k}"
        m.graph.initializer.append(onnx.numpy_helper.from_array(new, name))
        node.input[1] = name
        reshapes += 1
    try:
        shapes = _shapes(m, strict=True)
    except Exception as exc:  # noqa: BLE001 - the rewrite contradicts the graph somewhere
        return BatchProof(None, f"ONNX shape inference with a symbolic batch fails "
                                f"({first_line(exc)})")
    consts = _constants(m.graph)
    opset = opset_of(m)
    used = {i for n in m.graph.node for i in n.input} | {o.name for o in m.graph.output}
    for node in m.graph.node:
        ins = [i for i in node.input if i in carried]
        if not ins or node.op_type in SHAPE_ONLY:
            continue
        why = _mixes(node, carried, consts, shapes, opset)
        if why is not None:
            return BatchProof(None, f"{node.op_type} node {node.name or node.output[0]!r} "
                                    f"{why}")
        for out in node.output:
            if not out or out not in used:
                continue
            dims = shapes.get(out)
            if not dims or dims[0] != BATCH_PARAM:
                return BatchProof(None, f"the output of {node.op_type} node "
                                        f"{node.name or out!r} does not keep the batch as its "
                                        f"first dimension (inferred {_dims_text(dims)})")
    return BatchProof(m, None, reshapes)


def first_line(exc: BaseException) -> str:
    """An exception's message in one line (its last, where onnx puts the cause)."""
    text = str(exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:200]


def _dims_text(dims: Sequence[int | str | None] | None) -> str:
    if dims is None:
        return "no shape"
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _rank(name: str, shapes: dict[str, list[int | str | None] | None]) -> int | None:
    dims = shapes.get(name)
    return None if dims is None else len(dims)


def _axes(node: onnx.NodeProto, consts: dict[str, np.ndarray], position: int
          ) -> list[int] | None | str:
    """The node's ``axes`` (input ``position`` or attribute): a list, ``None`` when absent,
    or ``"unknown"`` when given by a tensor the graph computes."""
    if len(node.input) > position and node.input[position]:
        value = consts.get(node.input[position])
        return "unknown" if value is None else [int(a) for a in value.reshape(-1)]
    attr = _attr(node, "axes")
    return None if attr is None else [int(a) for a in attr]


def _touches_batch(axes: Sequence[int], rank: int | None) -> bool:
    return rank is None or any(a % rank == 0 for a in axes)


def _mixes(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
           shapes: dict[str, list[int | str | None] | None], opset: int) -> str | None:
    """Why ``node`` could mix samples of a batch (a phrase), or ``None`` when it acts on each
    sample alone."""
    op = node.op_type
    if op in PER_SAMPLE:
        if op == "BatchNormalization" and _attr(node, "training_mode", 0):
            return "computes batch statistics (training mode)"
        return None
    rank = _rank(node.input[0], shapes) if node.input else None
    rule = _RULES.get(op)
    if rule is None:
        return "is not an operation certify has shown to act per sample"
    return rule(node, carried, consts, rank, opset, shapes)


Rule = Callable[[onnx.NodeProto, set[str], dict[str, np.ndarray], "int | None", int,
                 dict[str, "list[int | str | None] | None"]], "str | None"]


def _axis_rule(default: int, pre13_flattens: bool = False, verb: str = "acts") -> Rule:
    """An operation along one ``axis``: it must not be the batch axis (before opset 13,
    Softmax-like operations flatten from ``axis`` on, which is per sample for ``axis >= 1``);
    ``verb`` names what it does there."""
    def rule(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
             rank: int | None, opset: int, shapes: Any) -> str | None:
        axis = int(_attr(node, "axis", 1 if pre13_flattens and opset < 13 else default))
        if rank is None:
            return f"{verb} along an axis of a tensor of unknown rank"
        if axis % rank == 0:
            return f"{verb} along the batch axis"
        return None
    return rule


def _reduce(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
            rank: int | None, opset: int, shapes: Any) -> str | None:
    takes_input = opset >= 18 or (node.op_type == "ReduceSum" and opset >= 13)
    axes = _axes(node, consts, 1) if takes_input else _axes(node, consts, 99)
    if axes == "unknown":
        return "reduces over axes the graph computes"
    if not axes:
        if _attr(node, "noop_with_empty_axes", 0):
            return None
        return "reduces over every axis, the batch included"
    assert isinstance(axes, list)
    return "reduces over the batch axis" if _touches_batch(axes, rank) else None


def _transpose(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
               rank: int | None, opset: int, shapes: Any) -> str | None:
    perm = _attr(node, "perm")
    if perm is None:
        return None if rank == 1 else "reverses the axes, moving the batch"
    return None if int(perm[0]) == 0 else "moves the batch axis"


def _flatten(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
             rank: int | None, opset: int, shapes: Any) -> str | None:
    axis = int(_attr(node, "axis", 1))
    if rank is None:
        return "flattens a tensor of unknown rank"
    return "flattens the batch into the image" if (axis + rank if axis < 0 else axis) == 0 \
        else None


def _squeeze(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
             rank: int | None, opset: int, shapes: Any) -> str | None:
    axes = _axes(node, consts, 1)
    if axes == "unknown":
        return "squeezes axes the graph computes"
    if not axes:
        return "squeezes every axis of size 1, the batch of 1 included"
    assert isinstance(axes, list)
    return "squeezes the batch axis" if _touches_batch(axes, rank) else None


def _unsqueeze(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
               rank: int | None, opset: int, shapes: Any) -> str | None:
    axes = _axes(node, consts, 1)
    if axes == "unknown" or not axes:
        return "inserts axes the graph computes"
    assert isinstance(axes, list)
    out = None if rank is None else rank + len(axes)
    return "inserts an axis before the batch" if _touches_batch(axes, out) else None


def _reshape(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
             rank: int | None, opset: int, shapes: Any) -> str | None:
    # row-major: an output whose first dimension is the input's batch keeps every sample's
    # elements together (the caller checks the inferred leading dimension)
    return "reshapes by a shape that depends on the image" if node.input[1] in carried else None


def _gather(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
            rank: int | None, opset: int, shapes: Any) -> str | None:
    data, index = (i in carried for i in node.input[:2])
    if data and index:
        return "gathers image data at positions from image data"
    if data:
        axis = int(_attr(node, "axis", 0))
        return "gathers along the batch axis" if rank is None or axis % rank == 0 else None
    return None  # a table looked up per sample by indices with a leading batch


def _slice(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
           rank: int | None, opset: int, shapes: Any) -> str | None:
    if opset < 10:
        axes = _attr(node, "axes")
        starts, ends = _attr(node, "starts"), _attr(node, "ends")
        steps = None
    else:
        if any(i in carried for i in node.input[1:]):
            return "slices at positions that depend on the image"
        axes = _axes(node, consts, 3)
        starts, ends = (consts.get(node.input[k]) if len(node.input) > k else None
                        for k in (1, 2))
        steps = consts.get(node.input[4]) if len(node.input) > 4 and node.input[4] else None
        if axes == "unknown" or starts is None or ends is None:
            return "slices at positions the graph computes"
    starts = [int(s) for s in np.asarray(starts).reshape(-1)]
    ends = [int(e) for e in np.asarray(ends).reshape(-1)]
    axes = list(range(len(starts))) if not axes else list(axes)
    step = [1] * len(starts) if steps is None else [int(s) for s in steps.reshape(-1)]
    for a, s, e, st in zip(axes, starts, ends, step, strict=False):
        if rank is None or a % rank == 0:
            if not (s == 0 and st == 1 and e >= _INT64_MAX // 2):
                return "slices the batch axis"
    return None


def _matmul(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
            rank: int | None, opset: int, shapes: Any) -> str | None:
    a, b = node.input[:2]
    ra, rb = _rank(a, shapes), _rank(b, shapes)
    if a in carried and (ra is None or ra < 2):
        return "contracts over the batch axis"
    if b in carried and (rb is None or rb < 3 or (a in carried and (ra or 0) < 3)):
        return "multiplies by image data across the batch axis"
    return None


def _gemm(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
          rank: int | None, opset: int, shapes: Any) -> str | None:
    if node.input[1] in carried:
        return "multiplies by image data across the batch axis"
    if node.input[0] in carried and _attr(node, "transA", 0):
        return "transposes the batch axis into the contraction"
    return None


def _pad(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
         rank: int | None, opset: int, shapes: Any) -> str | None:
    if opset < 11:
        pads = _attr(node, "pads")
    else:
        pads = consts.get(node.input[1]) if len(node.input) > 1 else None
        if pads is None:
            return "pads by amounts the graph computes"
        axes = _axes(node, consts, 3)
        if axes == "unknown":
            return "pads axes the graph computes"
        if axes:
            assert isinstance(axes, list)
            pads = np.asarray(pads).reshape(2, -1)
            touched = [a for k, a in enumerate(axes) if pads[0][k] or pads[1][k]]
            return "pads the batch axis" if _touches_batch(touched, rank) else None
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    half = len(pads) // 2
    return "pads the batch axis" if half and (pads[0] or pads[half]) else None


def _resize(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
            rank: int | None, opset: int, shapes: Any) -> str | None:
    scales = consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if opset < 11 and len(node.input) > 1:
        scales = consts.get(node.input[1])
    if scales is not None and scales.size and float(scales.reshape(-1)[0]) == 1.0:
        return None
    return "resizes to a size stated for a batch of 1"


def _tile(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
          rank: int | None, opset: int, shapes: Any) -> str | None:
    repeats = consts.get(node.input[1]) if len(node.input) > 1 else None
    if repeats is None:
        return "repeats by amounts the graph computes"
    return None if int(repeats.reshape(-1)[0]) == 1 else "repeats the batch"


def _expand(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
            rank: int | None, opset: int, shapes: Any) -> str | None:
    # broadcasting keeps a leading batch where the shape's first dimension is 1 (checked by
    # the inferred output shape)
    return "expands to a shape that depends on the image" if node.input[1] in carried else None


def _layer_norm(node: onnx.NodeProto, carried: set[str], consts: dict[str, np.ndarray],
                rank: int | None, opset: int, shapes: Any) -> str | None:
    axis = int(_attr(node, "axis", -1))
    if rank is None:
        return "normalises a tensor of unknown rank"
    return "normalises over the batch axis" if axis % rank == 0 else None


_RULES: dict[str, Rule] = {
    **{op: _reduce for op in REDUCTIONS},
    "Softmax": _axis_rule(-1, pre13_flattens=True),
    "LogSoftmax": _axis_rule(-1, pre13_flattens=True),
    "Hardmax": _axis_rule(-1, pre13_flattens=True),
    "ArgMax": _axis_rule(0), "ArgMin": _axis_rule(0), "TopK": _axis_rule(-1),
    "CumSum": lambda n, c, k, r, o, s: "sums cumulatively along an axis the graph computes"
    if n.input[1] not in k else ("sums along the batch axis"
                                 if r is None or int(k[n.input[1]].reshape(-1)[0]) % r == 0
                                 else None),
    "Transpose": _transpose, "Flatten": _flatten, "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze, "Reshape": _reshape, "Gather": _gather, "Slice": _slice,
    "Split": _axis_rule(0, verb="splits"), "MatMul": _matmul, "Gemm": _gemm,
    "Concat": _axis_rule(0, verb="concatenates"), "Pad": _pad,
    "Resize": _resize, "Upsample": _resize, "Tile": _tile, "Expand": _expand,
    "LayerNormalization": _layer_norm,
}


def same_alone_and_batched(run: Callable[[np.ndarray], np.ndarray],
                           run_one: Callable[[np.ndarray], np.ndarray], x: np.ndarray,
                           tolerance: float) -> str | None:
    """Why ``run`` on batches of ``x`` (model-input arrays) does not give each image the
    answer ``run_one`` gives it alone, or ``None`` when it does, within ``tolerance`` (relative
    to the answers' largest magnitude, at least 1). Two batch make-ups: all images in order,
    and reversed with every image beside others (so an answer that depends on its neighbours
    shows)."""
    alone = np.concatenate([run_one(x[i:i + 1]) for i in range(len(x))])
    scale = max(1.0, float(np.abs(alone).max())) if alone.size else 1.0
    order = np.arange(len(x))
    for name, idx in (("in one batch", order), ("reversed, with repeats",
                                                np.concatenate([order[::-1], order[:2]]))):
        batched = run(x[idx])
        if batched.shape[0] != len(idx) or batched.shape[1:] != alone.shape[1:]:
            return (f"a batch of {len(idx)} answers shape {list(batched.shape)}, one image "
                    f"{list(alone.shape[1:])}")
        diff = float(np.abs(batched.astype(np.float64) - alone[idx]).max())
        if diff > tolerance * scale:
            return (f"real images answer differently {name} than alone (max |Δ| {diff:.3g}, "
                    f"tolerance {tolerance:g} × {scale:.3g})")
    return None


def described(mode: str, why: str | None) -> str:
    """How the model was batched, in a sentence for the card's provenance."""
    if mode.startswith("symbolic (rewritten"):
        return ("exported at batch 1; run on batches after ONNX shape inference showed every "
                "tensor on the image's path keeps the batch as its first dimension through "
                "per-sample operations, and images answered the same alone and in batches")
    return (f"exported at batch 1 and run one image at a time (onnxruntime per image, the "
            f"white-box copy mapped over images with torch.func.vmap): {why}")


__all__ = ["BATCH_PARAM", "BatchProof", "described", "first_line", "image_path", "opset_of",
           "prove_symbolic_batch", "same_alone_and_batched"]
