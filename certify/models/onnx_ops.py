"""The operator table of certify's ONNX-to-torch converter (:mod:`certify.models.torchcopy`).

One function per ONNX operator, with the operator's semantics at the graph's opset (11 to 20;
older forms where an operator changed: :func:`op_for`). Each takes the node's inputs (``None``
for an omitted optional input) and its attributes, and returns its outputs. They are held to
ONNX's own node tests (``tests/test_onnx_conformance.py``) and to the graphs torch's exporters
write for the model families teams ship (``tests/test_architectures.py``).

Tensors are computed in float32 where the graph says float16 or float64 (initializers are read
as float32 too): the copy's gradients are for searching, and every candidate is judged by
onnxruntime on the real model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import torch
import torch.nn.functional as F

#: ONNX attributes of one node, by name (ints, floats, strings, lists, tensors).
Attrs = dict[str, Any]
Op = Callable[[list[torch.Tensor | None], Attrs], list[torch.Tensor]]

def tensor(arr: np.ndarray) -> torch.Tensor:
    """An ONNX constant as a torch tensor (float16 and float64 as float32)."""
    if arr.dtype in (np.float16, np.float64):
        arr = arr.astype(np.float32)
    return torch.from_numpy(np.array(arr, copy=True))


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
    return OPS[op_type]


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
        return [tensor(onnx.numpy_helper.to_array(attrs["value"]))]
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


#: ONNX operator -> its converter (the semantics of opset 13 on; older: :func:`op_for`)
OPS: dict[str, Op] = {
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
