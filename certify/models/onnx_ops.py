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


def _text(v: Any) -> str:
    """A string attribute as text."""
    return v.decode() if isinstance(v, bytes) else str(v)


def _auto_pads(attrs: Attrs, sizes: Sequence[int], kernel: Sequence[int],
               strides: Sequence[int], crop: bool) -> list[int]:
    """A convolution's or pooling's pads ``[begin..., end...]`` over the spatial ``sizes``:
    ``pads`` (NOTSET), none (VALID), or SAME_UPPER's and SAME_LOWER's (a total of
    ``(ceil(size / stride) - 1) * stride + kernel - size``, the kernel undilated as in
    onnxruntime and ONNX's reference; an odd total's extra pad at the end for UPPER, the start
    for LOWER; halved toward zero as in onnxruntime). A negative total crops with ``crop``
    (pooling, in onnxruntime and ONNX's reference) and is no padding without (Conv)."""
    auto = _text(attrs.get("auto_pad", b"NOTSET"))
    n = len(kernel)
    if auto in ("NOTSET", ""):
        return _ints(attrs.get("pads", [0] * (2 * n)))
    if auto == "VALID":
        return [0] * (2 * n)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise ValueError(f"auto_pad {auto} is not supported")
    total = [(-(-size // s) - 1) * s + k - size
             for size, k, s in zip(sizes, kernel, strides, strict=True)]
    total = total if crop else [max(t, 0) for t in total]
    begin = [math.trunc((t + (auto == "SAME_LOWER")) / 2) for t in total]
    return begin + [t - b for t, b in zip(total, begin, strict=True)]


def _torch_pad(pads: Sequence[int]) -> list[int]:
    """ONNX pads ``[begin..., end...]`` of the last ``len(pads) // 2`` axes as F.pad's spec
    (the last axis first)."""
    n = len(pads) // 2
    return [p for d in reversed(range(n)) for p in (pads[d], pads[d + n])]


def _spatial(x: torch.Tensor, attrs: Attrs, kernel: Sequence[int], crop: bool = False
             ) -> tuple[list[int], list[int], list[int]]:
    """(strides, dilations, pads ``[begin..., end...]``: :func:`_auto_pads`) of a 1-D, 2-D or
    3-D node on ``x``."""
    n = len(kernel)
    if n not in (1, 2, 3) or x.dim() != n + 2:
        raise ValueError(f"only 1-D, 2-D and 3-D windows are supported (kernel {kernel}, "
                         f"input of rank {x.dim()})")
    stride = _ints(attrs.get("strides", [1] * n))
    dil = _ints(attrs.get("dilations", [1] * n))
    return stride, dil, _auto_pads(attrs, list(x.shape[2:]), kernel, stride, crop)


def _conv(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """Conv, 1-D to 3-D (``auto_pad`` and asymmetric pads included)."""
    x, w, b = _a(args, 0), _a(args, 1), (args[2] if len(args) > 2 else None)
    kernel = _ints(attrs.get("kernel_shape", list(w.shape[2:])))
    stride, dil, pads = _spatial(x, attrs, kernel)
    n = len(kernel)
    conv = (F.conv1d, F.conv2d, F.conv3d)[n - 1]
    group = int(attrs.get("group", 1))
    if pads[:n] == pads[n:] and min(pads) >= 0:
        return [conv(x, w, b, stride, pads[:n], dil, group)]
    return [conv(F.pad(x, _torch_pad(pads)), w, b, stride, 0, dil, group)]


def _pool_sizes(sizes: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                dil: Sequence[int], pads: Sequence[int], ceil: bool) -> list[int]:
    """ONNX's pooled lengths of the spatial axes (with ``ceil_mode`` the last window starts
    inside the input or its leading pad)."""
    n = len(kernel)
    out = []
    for j in range(n):
        span = sizes[j] + pads[j] + pads[j + n] - (kernel[j] - 1) * dil[j] - 1
        o = (-(-span // stride[j]) if ceil else span // stride[j]) + 1
        out.append(o - 1 if ceil and (o - 1) * stride[j] >= sizes[j] + pads[j] else o)
    return out


def _leading(t: torch.Tensor, out: Sequence[int]) -> torch.Tensor:
    """The first ``out`` positions of ``t``'s spatial axes (from axis 2 on)."""
    for j, o in enumerate(out):
        t = t.narrow(2 + j, 0, o)
    return t


def _max_pool(x: torch.Tensor, kernel: list[int], stride: list[int], dil: list[int],
              pads: list[int], ceil: bool, storage_order: int, indices: bool = True
              ) -> list[torch.Tensor]:
    """MaxPool's values and Indices: each maximum's index in the flattened input ``[N, C,
    *spatial]`` (pads not counted; the spatial axes column-major with ``storage_order=1``).
    Without ``indices``, the values alone: for the many graphs that do not read the Indices,
    whose arithmetic took a third of a small CNN's forward pass in the torch copy
    (benchmarks/RESULTS.md, issue 66)."""
    n = len(kernel)
    sizes = list(x.shape[2:])
    pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[n - 1]
    out = _pool_sizes(sizes, kernel, stride, dil, pads, ceil)
    if pads[:n] == pads[n:] and all(0 <= p <= k // 2
                                    for p, k in zip(pads[:n], kernel, strict=True)):
        xin, pad, padded, offset = x, pads[:n], sizes, [0] * n
    else:  # padded by hand, so torch's ceil_mode may give one more window than ONNX's
        xin = F.pad(x, _torch_pad(pads), value=float("-inf"))
        pad, padded, offset = [0] * n, list(xin.shape[2:]), pads[:n]
    if not indices:
        return [_leading(pool(xin, kernel, stride, pad, dil, ceil), out)]
    y, idx = pool(xin, kernel, stride, pad, dil, ceil, return_indices=True)
    y, idx = _leading(y, out), _leading(idx, out)
    coords = []
    for size in reversed(padded):
        coords.append(idx % size)
        idx = idx // size
    coords = [c - o for c, o in zip(reversed(coords), offset, strict=True)]
    flat = torch.zeros_like(idx)
    for j in (range(n) if storage_order == 0 else reversed(range(n))):
        flat = flat * sizes[j] + coords[j]
    planes = torch.arange(x.shape[0] * x.shape[1], device=x.device)
    flat = flat + planes.reshape(x.shape[0], x.shape[1], *[1] * n) * math.prod(sizes)
    return [y, flat]


def _avg_pool(x: torch.Tensor, kernel: list[int], stride: list[int], dil: list[int],
              pads: list[int], ceil: bool, include: bool) -> torch.Tensor:
    """AveragePool: each window's mean over the input's values (and the pads' zeros with
    ``count_include_pad``; never the positions ``ceil_mode`` adds past the end pad)."""
    n = len(kernel)
    if pads[:n] == pads[n:] and dil == [1] * n and \
            all(0 <= p <= k // 2 for p, k in zip(pads[:n], kernel, strict=True)):
        pool = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[n - 1]
        return pool(x, kernel, stride, pads[:n], ceil, include)
    # windowed sums as a convolution with a (dilated) kernel of ones, over the counted positions
    sizes = list(x.shape[2:])
    out = _pool_sizes(sizes, kernel, stride, dil, pads, ceil)
    extra = [max((o - 1) * s + (k - 1) * d + 1 - (size + b + e), 0) for o, s, k, d, size, b, e
             in zip(out, stride, kernel, dil, sizes, pads[:n], pads[n:], strict=True)]
    grown = pads[:n] + [e + more for e, more in zip(pads[n:], extra, strict=True)]
    ones = torch.ones((1, 1, *sizes), dtype=x.dtype, device=x.device)
    if include:
        ones = F.pad(ones, _torch_pad(pads), value=1.0)
        counted = F.pad(ones, _torch_pad([0] * n + extra))
    else:
        counted = F.pad(ones, _torch_pad(grown))
    conv = (F.conv1d, F.conv2d, F.conv3d)[n - 1]
    kernel_ones = torch.ones((1, 1, *kernel), dtype=x.dtype, device=x.device)
    xp = F.pad(x, _torch_pad(grown))
    sums = conv(xp.reshape(-1, 1, *xp.shape[2:]), kernel_ones, None, stride, 0, dil)
    counts = conv(counted, kernel_ones, None, stride, 0, dil)
    y = (sums / counts).reshape(*x.shape[:2], *sums.shape[2:])
    return _leading(y, out)


def _pool(kind: str) -> Op:
    """MaxPool (values and Indices) or AveragePool, 1-D to 3-D."""
    def op(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
        x = _a(args, 0)
        kernel = _ints(attrs["kernel_shape"])
        stride, dil, pads = _spatial(x, attrs, kernel, crop=True)
        ceil = bool(attrs.get("ceil_mode", 0))
        if kind == "max":  # the Indices only where the graph reads them (N_OUTPUTS)
            return _max_pool(x, kernel, stride, dil, pads, ceil,
                             int(attrs.get("storage_order", 0)),
                             indices=int(attrs.get(N_OUTPUTS, 2)) >= 2)
        include = bool(attrs.get("count_include_pad", 0))
        return [_avg_pool(x, kernel, stride, dil, pads, ceil, include)]
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
    """BatchNormalization; with ``training_mode`` (opset 14) normalised by the batch's mean
    and (population) variance, the running ones updated by ``momentum`` as outputs 2 and 3."""
    x, scale, bias, mean, var = (_a(args, k) for k in range(5))
    eps = float(attrs.get("epsilon", 1e-5))
    if not int(attrs.get("training_mode", 0)):
        return [F.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)]
    dims = [0, *range(2, x.dim())]
    m, v = x.mean(dim=dims), x.var(dim=dims, unbiased=False)
    keep = float(attrs.get("momentum", 0.9))
    return [F.batch_norm(x, m, v, scale, bias, False, 0.0, eps),
            mean * keep + m * (1 - keep), var * keep + v * (1 - keep)]


def _clip(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    x = _a(args, 0)
    lo = args[1] if len(args) > 1 and args[1] is not None else attrs.get("min")
    hi = args[2] if len(args) > 2 and args[2] is not None else attrs.get("max")
    if lo is None and hi is None:  # no bounds: the identity
        return [x]
    num = float if x.is_floating_point() else int
    return [x.clamp(None if lo is None else num(lo), None if hi is None else num(hi))]


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


#: ONNX integer types torch holds as they are (other integers are held as int64).
_INTS: dict[int, torch.dtype] = {
    onnx.TensorProto.INT8: torch.int8, onnx.TensorProto.UINT8: torch.uint8,
    onnx.TensorProto.INT16: torch.int16, onnx.TensorProto.INT32: torch.int32,
    onnx.TensorProto.INT64: torch.int64}


def _cast(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """Cast: to float32 for float and double (the copy's float), rounded as float16 or
    bfloat16 would round for those (still held in float32, gradients flowing), to bool, or to
    an integer type (truncating floats toward zero). Other types (float8, strings) are
    refused: the copy fails with the reason rather than compute another function."""
    x, to = _a(args, 0), int(attrs["to"])
    if to in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
        return [x.float()]
    if to in _HALVES:
        return [x.to(_HALVES[to]).float()]
    if to == onnx.TensorProto.BOOL:
        return [x != 0]
    if to not in _INTS:
        raise ValueError(f"Cast to {onnx.helper.tensor_dtype_to_string(to)} is not supported")
    dtype = _INTS[to]
    return [x.trunc().to(dtype) if x.is_floating_point() else x.to(dtype)]


#: The 16-bit float types a Cast rounds to.
_HALVES: dict[int, torch.dtype] = {onnx.TensorProto.FLOAT16: torch.float16,
                                  onnx.TensorProto.BFLOAT16: torch.bfloat16}


def _argmax(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """ArgMax: the index of the first largest value along ``axis`` (the last with
    ``select_last_index``)."""
    x = _a(args, 0)
    axis = int(attrs.get("axis", 0)) % max(x.dim(), 1)
    keep = bool(attrs.get("keepdims", 1))
    if int(attrs.get("select_last_index", 0)):
        return [x.shape[axis] - 1 - x.flip(axis).argmax(dim=axis, keepdim=keep)]
    return [x.argmax(dim=axis, keepdim=keep)]


def _topk(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """TopK: the ``k`` largest (smallest) values along ``axis`` and their indices, equal
    values in index order (a stable sort; torch.topk orders ties arbitrarily)."""
    k = int(_a(args, 1).reshape(-1)[0])
    axis = int(attrs.get("axis", -1))
    largest = bool(attrs.get("largest", 1))
    values, index = _a(args, 0).sort(dim=axis, descending=largest, stable=True)
    return [values.narrow(axis, 0, k), index.narrow(axis, 0, k)]


def _gather(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """Gather along ``axis``; a negative index counts from the end."""
    x, idx = _a(args, 0), _a(args, 1).long()
    axis = int(attrs.get("axis", 0)) % x.dim()
    idx = torch.where(idx < 0, idx + x.shape[axis], idx)
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


def _pad_index(mode: str, size: int, begin: int, end: int) -> list[int]:
    """The source positions along an axis of ``size`` padded by ``begin`` and ``end`` in the
    ``edge``, ``reflect`` (no edge repeat) or ``wrap`` mode; a negative pad crops first (the
    padding repeats what is kept, as in onnxruntime)."""
    lo = max(-begin, 0)
    kept = size - lo - max(-end, 0)
    period = 2 * (kept - 1)
    index = []
    for j in range(-max(begin, 0), kept + max(end, 0)):
        if mode == "edge":
            at = min(max(j, 0), kept - 1)
        elif mode == "wrap":
            at = j % kept
        else:
            at = j % period if period else 0
            at = at if at < kept else period - at
        index.append(lo + at)
    return index


def _pad(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """Pad in the ``constant``, ``edge``, ``reflect`` or ``wrap`` (opset 19) mode: ``pads``
    ``[begin..., end...]`` (an input from opset 11; negative pads crop) over the ``axes``
    input's axes (opset 18; all by default)."""
    x = _a(args, 0)
    mode = _text(attrs.get("mode", b"constant"))
    given = args[1] if len(args) > 1 else None
    pads = _ints(given.reshape(-1).tolist()) if given is not None \
        else _ints(attrs.get("pads", []))
    value = args[2] if len(args) > 2 and args[2] is not None else attrs.get("value", 0.0)
    r = x.dim()
    axes = [a % r for a in _ints(args[3].reshape(-1).tolist())] \
        if len(args) > 3 and args[3] is not None else list(range(r))
    begin, end = [0] * r, [0] * r
    for k, axis in enumerate(axes):
        begin[axis], end[axis] = pads[k], pads[k + len(axes)]
    if mode == "constant":
        num = float if x.is_floating_point() else int
        return [F.pad(x, _torch_pad(begin + end), value=num(value))]
    if mode not in ("edge", "reflect", "wrap"):
        raise ValueError(f"Pad mode {mode} is not supported")
    for axis in range(r):
        if begin[axis] or end[axis]:
            index = _pad_index(mode, x.shape[axis], begin[axis], end[axis])
            x = x.index_select(axis, torch.tensor(index, device=x.device))
    return [x]


def _reduce(f: Callable[..., torch.Tensor]) -> Op:
    """A Reduce operator over ``axes`` (an attribute, or an input from opset 13 for ReduceSum
    and 18 for the others); no axes: all of them, or none with ``noop_with_empty_axes``."""
    def op(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
        x = _a(args, 0)
        axes = _axes(args, attrs)
        if not axes and int(attrs.get("noop_with_empty_axes", 0)):
            return [x]
        return [f(x, dim=axes or list(range(x.dim())), keepdim=bool(attrs.get("keepdims", 1)))]
    return op


def _unary(f: Callable[[torch.Tensor], torch.Tensor]) -> Op:
    return lambda args, attrs: [f(_a(args, 0))]


def _straight(f: Callable[[torch.Tensor], torch.Tensor]) -> Op:
    """A step function (Round, Floor, Ceil, Sign) with its exact values and the identity's
    gradient (BPDA's straight-through estimator, Athalye et al. 2018): its own gradient is zero
    almost everywhere, so inside a network (an input-quantising defence) it would hand the
    attacks nothing and their failure would read as robustness."""
    def op(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
        x = _a(args, 0)
        y = f(x)
        return [y + (x - x.detach()) if x.is_floating_point() else y]
    return op


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


def _per_axis(p: torch.Tensor, x: torch.Tensor, attrs: Attrs) -> torch.Tensor:
    """A scale or zero point shaped to broadcast over ``x``: a scalar as it is, a 1-D one along
    ``axis`` (default 1), a blocked one (``block_size``, opset 21) repeated along ``axis``."""
    if p.dim() == 0:
        return p
    axis = int(attrs.get("axis", 1)) % x.dim()
    block = int(attrs.get("block_size", 0))
    if block:
        return p.repeat_interleave(block, dim=axis).narrow(axis, 0, x.shape[axis])
    return p.reshape([-1 if d == axis else 1 for d in range(x.dim())]) if p.dim() == 1 else p


def _quant(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """QuantizeLinear: ``saturate(round(x / scale) + zero_point)``, rounding half to even, in
    the zero point's integer type (without one: ``output_dtype`` (opset 21), else uint8);
    per tensor, per axis or per block (:func:`_per_axis`)."""
    x, scale = _a(args, 0), _a(args, 1)
    zero = args[2] if len(args) > 2 and args[2] is not None else None
    dtype = zero.dtype if zero is not None and not zero.is_floating_point() \
        else _INTS.get(int(attrs.get("output_dtype", 0)), torch.uint8)
    unrounded = x / _per_axis(scale, x, attrs)
    q = torch.round(unrounded)
    if zero is not None:
        shift = _per_axis(zero, x, attrs).float()
        q, unrounded = q + shift, unrounded + shift
    q = q.clamp(torch.iinfo(dtype).min, torch.iinfo(dtype).max)
    if attrs.get(STRAIGHT_THROUGH):
        # BPDA (Athalye et al. 2018): the integer values, as floats, with the gradient of
        # x / scale, so a quantise-dequantise pair passes the gradient on unchanged
        return [q + (unrounded - unrounded.detach())]
    return [q.to(dtype)]


def _dequant(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """DequantizeLinear: ``(x - zero_point) * scale``, per tensor, per axis or per block
    (:func:`_per_axis`)."""
    x, scale = _a(args, 0), _a(args, 1)
    y = x.float()
    if len(args) > 2 and args[2] is not None:
        y = y - _per_axis(args[2], x, attrs).float()
    return [y * _per_axis(scale, x, attrs)]


def _div(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """Div; integers divide truncating toward zero (C's ``/``, as onnxruntime)."""
    a, b = _a(args, 0), _a(args, 1)
    if a.is_floating_point() or b.is_floating_point():
        return [a / b]
    return [torch.div(a, b, rounding_mode="trunc")]


def _pow(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """Pow, in the base's type (an integer base with a float exponent truncates)."""
    a = _a(args, 0)
    y = torch.pow(a, _a(args, 1))
    return [y if y.dtype == a.dtype else y.to(a.dtype)]


def _dropout(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """Dropout as at inference: the input, and the optional mask (all True). The ``ratio``
    and ``training_mode`` inputs (opset 12) change nothing: training mode's random mask is not
    drawn (the identity is its expectation)."""
    x = _a(args, 0)
    return [x, torch.ones_like(x, dtype=torch.bool)]


def _shape(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """Shape, of the axes from ``start`` to ``end`` (opset 15; negative from the end,
    clamped to the rank)."""
    end = attrs.get("end")
    x = _a(args, 0)
    dims = list(x.shape)[int(attrs.get("start", 0)):None if end is None else int(end)]
    return [torch.tensor(dims, dtype=torch.int64, device=x.device)]


# -- operators of transformer exports and shape arithmetic -----------------------------------
#: The attribute the node reader adds to a node whose operator needs its number of outputs
#: (Split into equal parts; MaxPool, which computes its Indices only where the graph names
#: that output).
N_OUTPUTS: str = "_n_outputs"
#: The operators that are given it.
NEEDS_OUTPUTS = frozenset({"Split", "MaxPool"})
#: The attribute the node reader adds to a QuantizeLinear whose output only DequantizeLinear
#: nodes read (a quantised network's Q/DQ pair): its values stay floats with a straight-through
#: gradient, instead of an integer tensor no gradient passes.
STRAIGHT_THROUGH: str = "_straight_through"


def _shape_arg(t: torch.Tensor) -> list[int]:
    """A shape-like input (constant in real graphs) as Python integers."""
    return [int(v) for v in t.reshape(-1).tolist()]


def _layer_norm(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """LayerNormalization (opset 17): normalise over the axes from ``axis`` on; outputs Y and
    the optional Mean and InvStdDev (shaped like X with 1 over the normalised axes)."""
    x, scale, bias = _a(args, 0), _a(args, 1), (args[2] if len(args) > 2 else None)
    axis = int(attrs.get("axis", -1)) % x.dim()
    eps = float(attrs.get("epsilon", 1e-5))
    dims = list(range(axis, x.dim()))
    xf = x.float()
    mean = xf.mean(dim=dims, keepdim=True)
    inv = torch.rsqrt((xf - mean).square().mean(dim=dims, keepdim=True) + eps)
    y = (xf - mean) * inv * scale
    if bias is not None:
        y = y + bias
    return [y, mean, inv]


def _gelu(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """Gelu (opset 20): exact, or its tanh approximation."""
    approx = attrs.get("approximate", b"none")
    approx = approx.decode() if isinstance(approx, bytes) else str(approx)
    return [F.gelu(_a(args, 0), approximate=approx)]


def _constant_of_shape(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """ConstantOfShape: a tensor of the input shape filled with ``value`` (float 0 unless
    given), in ``value``'s type."""
    shape = _shape_arg(_a(args, 0))
    if "value" in attrs:
        value = torch.from_numpy(np.array(onnx.numpy_helper.to_array(attrs["value"]),
                                          copy=True)).reshape(-1)[:1]
        if value.dtype in (torch.float16, torch.float64):
            value = value.float()
        return [value.to(args[0].device if args[0] is not None else None)
                .reshape(()).expand(shape).clone()]
    return [torch.zeros(shape, device=args[0].device if args[0] is not None else None)]


def _expand(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """Expand: broadcast to the given shape, both ways (a 1 in the shape keeps X's size)."""
    x = _a(args, 0)
    return [x.expand(torch.broadcast_shapes(x.shape, tuple(_shape_arg(_a(args, 1)))))]


def _where(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    return [torch.where(_a(args, 0).bool(), _a(args, 1), _a(args, 2))]


def _mod(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """Mod: the sign of the divisor (Python's %), or of the dividend with ``fmod=1``."""
    a, b = _a(args, 0), _a(args, 1)
    return [torch.fmod(a, b) if int(attrs.get("fmod", 0)) else torch.remainder(a, b)]


_INT64_MAX = 2**63 - 1


def _slice_bounds(start: int, end: int, step: int, dim: int) -> tuple[int, int]:
    """ONNX's clamping of a Slice's start and end on an axis of size ``dim`` (an end of
    INT64_MAX with a negative step runs to the beginning, as onnxruntime reads it)."""
    if step < 0 and end >= _INT64_MAX:
        end = -dim - 1
    start += dim if start < 0 else 0
    end += dim if end < 0 else 0
    if step > 0:
        return min(max(start, 0), dim), min(max(end, 0), dim)
    return min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)


def _slice(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """Slice: starts, ends, axes and steps as inputs (opset 10 on) or attributes (before)."""
    x = _a(args, 0)
    if len(args) > 1:
        starts, ends = _shape_arg(_a(args, 1)), _shape_arg(_a(args, 2))
        given = args[3] if len(args) > 3 else None
        axes = _shape_arg(given) if given is not None else list(range(len(starts)))
        given = args[4] if len(args) > 4 else None
        steps = _shape_arg(given) if given is not None else [1] * len(starts)
    else:
        starts, ends = _ints(attrs["starts"]), _ints(attrs["ends"])
        axes = _ints(attrs.get("axes", list(range(len(starts)))))
        steps = [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        axis %= x.dim()
        if step == 0:
            raise ValueError("Slice step 0")
        lo, hi = _slice_bounds(start, end, step, x.shape[axis])
        if step > 0:
            index: list[slice] = [slice(None)] * x.dim()
            index[axis] = slice(lo, hi, step)
            x = x[tuple(index)]
        elif lo <= hi:  # nothing from lo down to hi
            x = x.narrow(axis, 0, 0)
        else:
            x = x.index_select(axis, torch.arange(lo, hi, step, device=x.device))
    return [x]


def _range(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """Range: ``max(ceil((limit - start) / delta), 0)`` values from ``start``."""
    start, limit, delta = _a(args, 0), _a(args, 1), _a(args, 2)
    n = max(math.ceil((float(limit) - float(start)) / float(delta)), 0)
    return [start + torch.arange(n, dtype=start.dtype, device=start.device) * delta]


def _tile(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    return [_a(args, 0).repeat(_shape_arg(_a(args, 1)))]


def _split(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """Split along ``axis``: by the ``split`` sizes (an input from opset 13, an attribute
    before), into ``num_outputs`` parts (opset 18; the last one smaller), or into as many equal
    parts as the node has outputs."""
    x = _a(args, 0)
    axis = int(attrs.get("axis", 0)) % x.dim()
    given = args[1] if len(args) > 1 else None
    if given is not None:
        return list(x.split(_shape_arg(given), dim=axis))
    if "split" in attrs:
        return list(x.split(_ints(attrs["split"]), dim=axis))
    parts = int(attrs["num_outputs"] if "num_outputs" in attrs else attrs.get(N_OUTPUTS, 1))
    if "num_outputs" in attrs:
        return list(x.split(math.ceil(x.shape[axis] / parts), dim=axis))
    if x.shape[axis] % parts:
        raise ValueError(f"Split of {x.shape[axis]} into {parts} equal parts")
    return list(x.split(x.shape[axis] // parts, dim=axis))


def _einsum(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    equation = attrs["equation"]
    equation = equation.decode() if isinstance(equation, bytes) else str(equation)
    return [torch.einsum(equation, *[a for a in args if a is not None])]


def _scatter_nd(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    """ScatterND: ``updates`` written into ``data`` at the index tuples of ``indices`` (the
    last axis); ``reduction`` (opset 16 on) combines them with what is there."""
    data, indices, updates = _a(args, 0), _a(args, 1).long(), _a(args, 2)
    how = attrs.get("reduction", b"none")
    how = how.decode() if isinstance(how, bytes) else str(how)
    k = indices.shape[-1]
    idx = indices.reshape(-1, k)
    idx = torch.where(idx < 0, idx + torch.tensor(data.shape[:k], device=idx.device), idx)
    upd = updates.reshape(-1, *data.shape[k:])
    where = tuple(idx.unbind(1))
    if how in ("none", "add"):
        return [data.index_put(where, upd, accumulate=how == "add")]
    combine = {"mul": torch.mul, "max": torch.maximum, "min": torch.minimum}[how]
    out = data.clone()
    for row, value in zip(idx.tolist(), upd, strict=True):
        out[tuple(row)] = combine(out[tuple(row)], value)
    return [out]


def _prelu(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    x, slope = _a(args, 0), _a(args, 1)
    return [torch.where(x < 0, x * slope, x)]


def _softplus(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    return [F.softplus(_a(args, 0))]


def _is_inf(args: list[torch.Tensor | None], attrs: Attrs) -> list[torch.Tensor]:
    x = _a(args, 0)
    pos = bool(attrs.get("detect_positive", 1))
    neg = bool(attrs.get("detect_negative", 1))
    return [((x == math.inf) & pos) | ((x == -math.inf) & neg)]


def _extreme(f: Callable[..., torch.Tensor], empty: float) -> Callable[..., torch.Tensor]:
    """ReduceMax or ReduceMin: over an empty axis, the identity of the reduction (-inf for
    the maximum, +inf for the minimum; False and True for booleans), as ONNX defines it."""
    def reduce(x: torch.Tensor, dim: list[int], keepdim: bool) -> torch.Tensor:
        if all(x.shape[d] for d in dim):
            return f(x, dim=dim, keepdim=keepdim)
        shape = [1 if d in [a % x.dim() for a in dim] else n for d, n in enumerate(x.shape)]
        if not keepdim:
            shape = [n for d, n in enumerate(shape) if d not in [a % x.dim() for a in dim]]
        fill: float | bool = empty if x.is_floating_point() else (
            bool(empty > 0) if x.dtype == torch.bool else
            (torch.iinfo(x.dtype).max if empty > 0 else torch.iinfo(x.dtype).min))
        return torch.full(shape, fill, dtype=x.dtype, device=x.device)
    return reduce


def _reduce_prod(x: torch.Tensor, dim: list[int], keepdim: bool) -> torch.Tensor:
    for d in sorted((d % x.dim() for d in dim), reverse=True):
        x = x.prod(dim=d, keepdim=keepdim)
    return x


def _reduce_l2(x: torch.Tensor, dim: list[int], keepdim: bool) -> torch.Tensor:
    return torch.linalg.vector_norm(x, 2, dim=dim, keepdim=keepdim)


#: ONNX operator -> its converter (the semantics of opset 13 on; older: :func:`op_for`)
OPS: dict[str, Op] = {
    "Conv": _conv, "Gemm": _gemm, "MaxPool": _pool("max"), "AveragePool": _pool("avg"),
    "GlobalAveragePool": _unary(lambda x: x.mean(dim=tuple(range(2, x.dim())), keepdim=True)),
    "GlobalMaxPool": _unary(lambda x: x.amax(dim=tuple(range(2, x.dim())), keepdim=True)),
    "MatMul": _binary(torch.matmul), "Add": _binary(torch.add), "Sub": _binary(torch.sub),
    "Mul": _binary(torch.mul), "Div": _div, "Pow": _pow,
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
    "Round": _straight(torch.round), "Floor": _straight(torch.floor),
    "Ceil": _straight(torch.ceil),
    "Identity": _unary(lambda x: x), "Dropout": _dropout,
    "Flatten": _flatten, "Reshape": _reshape, "Squeeze": _squeeze, "Unsqueeze": _unsqueeze,
    "Transpose": lambda args, attrs: [_a(args, 0).permute(
        *(_ints(attrs["perm"]) if "perm" in attrs else
          list(reversed(range(_a(args, 0).dim())))))],
    "Concat": lambda args, attrs: [torch.cat([a for a in args if a is not None],
                                             dim=int(attrs["axis"]))],
    "Shape": _shape,
    "Gather": _gather, "Constant": _constant, "BatchNormalization": _batchnorm,
    "Clip": _clip, "Softmax": _softmax(False), "LogSoftmax": _softmax(True),
    "Hardmax": _hardmax, "Cast": _cast,
    "ArgMax": _argmax, "TopK": _topk, "Pad": _pad,
    "ReduceMean": _reduce(torch.mean), "ReduceSum": _reduce(torch.sum),
    "QuantizeLinear": _quant, "DequantizeLinear": _dequant,
    # the operators of transformer exports, comparisons, logic and shape arithmetic
    "LayerNormalization": _layer_norm, "Gelu": _gelu, "ConstantOfShape": _constant_of_shape,
    "Expand": _expand, "Where": _where, "Mod": _mod, "Slice": _slice, "Range": _range,
    "Tile": _tile, "Split": _split, "Einsum": _einsum, "ScatterND": _scatter_nd,
    "IsNaN": _unary(torch.isnan), "IsInf": _is_inf, "PRelu": _prelu, "Softplus": _softplus,
    "Sign": _straight(torch.sign), "Sin": _unary(torch.sin), "Cos": _unary(torch.cos),
    "Equal": _binary(torch.eq), "Less": _binary(torch.lt), "Greater": _binary(torch.gt),
    "LessOrEqual": _binary(torch.le), "GreaterOrEqual": _binary(torch.ge),
    "Not": _unary(torch.logical_not), "And": _binary(torch.logical_and),
    "Or": _binary(torch.logical_or), "Xor": _binary(torch.logical_xor),
    "Sum": lambda args, attrs: [_fold(torch.add, args)],
    "Mean": lambda args, attrs: [_fold(torch.add, args) / sum(a is not None for a in args)],
    "ReduceMax": _reduce(_extreme(torch.amax, -math.inf)),
    "ReduceMin": _reduce(_extreme(torch.amin, math.inf)),
    "ReduceProd": _reduce(_reduce_prod), "ReduceL2": _reduce(_reduce_l2),
}
