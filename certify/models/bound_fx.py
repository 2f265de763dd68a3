"""The second front end of certify's verifier: the FX graph of a ``torch.export`` program.

:func:`fx_bound_graph` translates the graph of aten operations of an exported program
(``torch.export.export(module, (x,)).module()``, or ``torch.export.load(path).module()`` for a
``.pt2``: :mod:`certify.models.torchprog`) into the operator table of
:mod:`certify.models.bound_ops`: the same ONNX operator types with ONNX-style attributes, so
that its interval, CROWN and α-CROWN relaxations are the ones the ONNX front end uses (one op
set, two front ends). Parameters and buffers (``get_attr`` nodes) become constants; a node
without an input-dependent argument (``t`` / ``permute`` of a weight, ``ones``, …) is evaluated
once, as a constant.

The aten operations mapped (with an input-dependent argument):

==========================================================  ===================================
aten                                                        table (ONNX)
==========================================================  ===================================
conv1d / conv2d / conv3d / convolution (not transposed)     Conv
linear (2-D input), addmm                                   Gemm
linear (other ranks), mm, matmul (constant right operand)   MatMul (+ Add)
relu, leaky_relu                                            Relu, LeakyRelu
max_pool2d, max_pool2d_with_indices (+ getitem 0)           MaxPool
avg_pool2d (no ``divisor_override``)                        AveragePool
adaptive_avg_pool2d to 1×1, mean over all spatial axes      GlobalAveragePool (+ Flatten)
adaptive_avg_pool2d to a divisor of the input size          AveragePool
flatten, view, reshape, _unsafe_view, squeeze, unsqueeze    Flatten, Reshape
cat                                                         Concat
constant_pad_nd, pad, reflection_pad*, replication_pad*     Pad
add / sub / rsub / mul / div by constants, add / sub of     Add, Sub, Mul, Div
two input-dependent tensors
neg                                                         Neg
batch_norm, _native_batch_norm_legit_no_training,           BatchNormalization (inference)
native_batch_norm (not training; getitem 0)
dropout (not training), clone, detach, contiguous, alias,   (the input itself)
lift_fresh_copy
softmax / log_softmax as the graph's last operation         left out (see below)
==========================================================  ===================================

In-place forms (``relu_``, ``add_``, …) map as their functional forms. Anything else with an
input-dependent argument raises :class:`~certify.models.bound_ops.BoundsUnavailable` naming the
aten operation (``certified: not available (operator aten.sigmoid)``), as does a mapped one the
table cannot bound (``aten.mul`` of two input-dependent tensors, ``aten.linear`` with an
input-dependent weight …). A reshape keeps the batch axis where the program's recorded shapes
say it does (so a program exported at one batch size is bounded at any); the sizes the program
computes from its input (``sym_size``) are read from those shapes too.

**Softmax.** A softmax or log-softmax over the class axis that writes the program's output is
left out, as in the ONNX front end (:attr:`BoundGraph.dropped`): it keeps each row's order, so
the margins are those of its input (:meth:`BoundGraph.scores` applies it again).

**Checked against the program.** Once translated, the table is evaluated at a random input of
the program's recorded input shape and every translated tensor is compared with the program's
own value there (:data:`CHECK_TOLERANCE` of the tensor's scale); a translation that does not
reproduce an operation is refused (``BoundsUnavailable`` naming it), never bounded.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from certify.models.bound_ops import BoundGraph, BoundsUnavailable, InputMap, NodeSpec

#: A translated tensor must equal the program's within this share of the program's scale
#: (``1 + max |value|``) at the random input of the check.
CHECK_TOLERANCE = 1e-4
#: The ONNX opset whose semantics the table's operators have.
OPSET = 17

Node = torch.fx.Node


def fx_bound_graph(gm: torch.fx.GraphModule, input_map: InputMap | None = None,
                   max_crown_neurons: int = 4096) -> BoundGraph:
    """The operator table of an exported program's graph ``gm`` (module docstring), ready to
    bound: one image input (the preprocessed batch; ``input_map``: the preprocessing from
    certify's ``[0, 1]`` image to it), the first tensor it returns the class scores."""
    t = _Translation(gm)
    for n in gm.graph.nodes:
        t.visit(n)
    if not t.input_name:
        raise BoundsUnavailable("(input)", "the program takes no input")
    if not t.output_name:
        raise BoundsUnavailable("(output)", "the program returns no tensor")
    graph = BoundGraph.from_table(t.specs, t.constants, t.input_name, t.output_name,
                                  opset=OPSET, input_map=input_map,
                                  max_crown_neurons=max_crown_neurons)
    _check_values(gm, graph, t)
    return graph


# -- the translation ----------------------------------------------------------------------

#: Bookkeeping of the exported graph that computes nothing.
_SKIPPED = frozenset({
    "aten._assert_tensor_metadata", "aten._assert_scalar", "aten._assert_async",
    "aten._functional_assert_async", "aten.sym_constrain_range",
    "aten.sym_constrain_range_for_size", "aten._functional_sym_constrain_range",
    "aten._functional_sym_constrain_range_for_size", "aten._check_is_size"})
#: Sizes of the input (the program's shape arithmetic).
_SIZES = frozenset({"aten.sym_size", "aten.sym_numel", "aten.sym_stride",
                    "aten.sym_storage_offset"})


def _op_name(target: Any) -> str:
    """``aten.conv2d`` for an aten operation (any overload); ``module.name`` for a callable."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target.overloadpacket)
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", "") or ""
    return f"{module.lstrip('_')}.{getattr(target, '__name__', str(target))}".lstrip(".")


def _bind(n: Node) -> dict[str, Any]:
    """An aten node's arguments by their schema's names (defaults filled in)."""
    schema = n.target._schema  # type: ignore[union-attr]
    out: dict[str, Any] = {}
    for k, a in enumerate(schema.arguments):
        if k < len(n.args):
            out[a.name] = n.args[k]
        elif a.name in n.kwargs:
            out[a.name] = n.kwargs[a.name]
        else:
            out[a.name] = a.default_value if a.has_default_value() else None
    return out


def _meta_shape(n: Any) -> list[Any] | None:
    """The shape the program recorded for a node's tensor (ints and symbolic sizes)."""
    if not isinstance(n, Node):
        return None
    v = n.meta.get("val")
    if isinstance(v, torch.Tensor):
        return list(v.shape)
    tm = n.meta.get("tensor_meta")
    return list(tm.shape) if tm is not None and hasattr(tm, "shape") else None


def _ints(v: Any, n: int) -> list[int]:
    """An aten size argument (an int or a list, a 1-list repeated) as ``n`` ints."""
    vals = [int(i) for i in (v if isinstance(v, list | tuple) else [v])]
    return vals * n if len(vals) == 1 else vals


def _cpu64(v: Any) -> Any:
    """A value of the program on the CPU, floats as float64 (tuples and lists too)."""
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu()
        return v.to(torch.float64) if v.is_floating_point() else v
    if isinstance(v, list | tuple):
        return type(v)(_cpu64(i) for i in v)
    return v


class _Translation:
    """The table under construction: specs, constants, and per FX node the tensor name that
    holds its value (or its constant value, or that it is a size of the input)."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self.specs: list[NodeSpec] = []
        self.constants: dict[str, torch.Tensor] = {}
        #: the table's tensor holding each node's value now (input-dependent nodes, and the
        #: constants named so far)
        self.names: dict[Node, str] = {}
        #: the tensor that each node's own operation wrote (before any in-place operation)
        self.computed: dict[Node, str] = {}
        #: the nodes that depend on the input
        self.variable: set[Node] = set()
        #: input-dependent nodes returning a tuple: a name per element (``""``: not bounded)
        self.parts: dict[Node, list[str]] = {}
        #: nodes without an input-dependent argument: their values
        self.values: dict[Node, Any] = {}
        #: sizes computed from the input (read from the recorded shapes instead)
        self.sizes: set[Node] = set()
        self.input_name = ""
        self.output_name = ""
        self.placeholder: Node | None = None
        self._count = 0

    def visit(self, n: Node) -> None:
        """Translate one node (in the graph's topological order)."""
        if n.op == "placeholder":
            if self.placeholder is not None:
                raise BoundsUnavailable("(input)", "the program takes more than one input")
            self.placeholder, self.input_name = n, n.name
            self._set(n, n.name)
        elif n.op == "get_attr":
            obj: Any = self.gm
            for part in str(n.target).split("."):
                obj = getattr(obj, part)
            self.values[n] = _cpu64(obj)
        elif n.op == "output":
            self._output(n)
        elif n.op == "call_module":
            if not str(n.target).startswith("_guards"):  # torch.export's input check
                raise BoundsUnavailable(f"module {n.target}")
        elif n.op == "call_method":
            raise BoundsUnavailable(f"method {n.target}")
        else:
            self._call(n)

    def _call(self, n: Node) -> None:
        name = _op_name(n.target)
        inputs = n.all_input_nodes
        if name in _SKIPPED:
            return
        src, index = (n.args + (None, None))[:2]
        if n.target is operator.getitem and isinstance(src, Node) and src in self.parts:
            part = self.parts[src][int(index)]  # type: ignore[arg-type]
            if not part:
                raise BoundsUnavailable(_op_name(src.target),
                                        f"its output {index} (only the first is bounded)")
            self._set(n, part)
            return
        if name in _SIZES or (not isinstance(n.target, torch._ops.OpOverload)
                              and any(a in self.sizes for a in inputs)):
            self.sizes.add(n)
            return
        if not any(a in self.variable or a in self.sizes for a in inputs):
            self._fold(n, name)
            return
        base = name[:-1] if name.endswith("_") and name not in _CONVERTERS else name
        convert = _CONVERTERS.get(base)
        if convert is None:
            raise BoundsUnavailable(name)
        out = convert(self, n, _bind(n) if isinstance(n.target, torch._ops.OpOverload) else {})
        if isinstance(out, list):
            self.parts[n] = out
            self.variable.add(n)
            return
        self._set(n, out)
        if base != name and isinstance(n.args[0], Node):  # in place: the input holds it now
            self.names[n.args[0]] = out

    def _set(self, n: Node, name: str) -> None:
        """Node ``n`` (input-dependent) is computed into the tensor ``name``."""
        self.names[n] = self.computed[n] = name
        self.variable.add(n)

    def _fold(self, n: Node, name: str) -> None:
        """A node without an input-dependent argument: its value, once."""
        missing = [a for a in n.all_input_nodes if a not in self.values]
        if missing:
            raise BoundsUnavailable(name, f"its argument {missing[0].name} has no value")
        args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: self.values[a])
        kwargs = dict(kwargs)
        if "device" in kwargs:
            kwargs["device"] = torch.device("cpu")
        try:
            with torch.no_grad():
                value = n.target(*args, **kwargs)  # type: ignore[operator]
        except Exception as exc:  # noqa: BLE001 - any failure: the constant has no value
            raise BoundsUnavailable(name, f"a constant it computes: {type(exc).__name__}: "
                                          f"{str(exc)[:120]}") from None
        self.values[n] = _cpu64(value)

    def _output(self, n: Node) -> None:
        leaves, _ = torch.utils._pytree.tree_flatten(n.args[0])
        first = next((a for a in leaves if isinstance(a, Node)), None)
        if first is None:
            return
        if first not in self.variable:
            raise BoundsUnavailable("(output)", "it does not depend on the input")
        self.output_name = self.names[first]

    # helpers for the converters ----------------------------------------------------------
    def constant(self, value: torch.Tensor, owner: Node) -> str:
        """A new named constant of the table (for ``owner``)."""
        self._count += 1
        name = f"{owner.name}/c{self._count}"
        self.constants[name] = _cpu64(value)
        return name

    def tensor(self, a: Any, owner: Node) -> str:
        """The table's name of an argument: an input-dependent tensor, a constant node's value
        (named once) or a Python number (``""`` for ``None``)."""
        if a is None:
            return ""
        if not isinstance(a, Node):
            return self.constant(torch.tensor(float(a), dtype=torch.float64), owner)
        if a in self.names:
            return self.names[a]
        if a in self.sizes:
            raise BoundsUnavailable(_op_name(owner.target), "a size computed from the input")
        if a not in self.values or not isinstance(self.values[a], torch.Tensor | int | float):
            raise BoundsUnavailable(_op_name(owner.target), f"its argument {a.name}")
        v = self.values[a]
        self.constants[a.name] = v if isinstance(v, torch.Tensor) else \
            torch.tensor(float(v), dtype=torch.float64)
        self.names[a] = self.computed[a] = a.name
        return a.name

    def value(self, a: Any, owner: Node, what: str) -> torch.Tensor:
        """A constant argument's value (refused where it depends on the input)."""
        if isinstance(a, Node) and a in self.values and isinstance(self.values[a], torch.Tensor):
            return self.values[a]
        raise BoundsUnavailable(_op_name(owner.target), f"an input-dependent {what}")

    def emit(self, n: Node, op_type: str, inputs: list[str], attrs: dict[str, Any] | None = None,
             suffix: str = "") -> str:
        """Append an operator of the table computing (a step of) node ``n``; its output."""
        out = n.name + (f"/{suffix}" if suffix else "")
        self.specs.append(NodeSpec(op_type, inputs, [out], dict(attrs or {}), n.name,
                                   _op_name(n.target)))
        return out


# -- the converters: (translation, node, arguments by name) -> the output's name(s) --------

Converter = Callable[[_Translation, Node, dict[str, Any]], "str | list[str]"]


def _rank(t: _Translation, n: Node, a: Any) -> int:
    shape = _meta_shape(a)
    if shape is None:
        raise BoundsUnavailable(_op_name(n.target), "its input's shape is not recorded")
    return len(shape)


def _conv(t: _Translation, n: Node, a: dict[str, Any]) -> str:
    if a.get("transposed"):
        raise BoundsUnavailable(_op_name(n.target), "a transposed convolution")
    k = _rank(t, n, a["input"]) - 2
    kernel = list(t.value(a["weight"], n, "weight").shape[2:])
    dil = _ints(a["dilation"], k)
    padding = a["padding"]
    if padding == "valid":
        pads = [0] * (2 * k)
    elif padding == "same":  # torch's: the extra pad at the end
        total = [d * (s - 1) for d, s in zip(dil, kernel, strict=True)]
        pads = [p // 2 for p in total] + [p - p // 2 for p in total]
    else:
        pads = _ints(padding, k) * 2
    attrs = {"strides": _ints(a["stride"], k), "pads": pads, "dilations": dil,
             "group": int(a["groups"])}
    inputs = [t.tensor(a["input"], n), t.tensor(a["weight"], n)]
    if a.get("bias") is not None:
        inputs.append(t.tensor(a["bias"], n))
    return t.emit(n, "Conv", inputs, attrs)


def _linear(t: _Translation, n: Node, a: dict[str, Any]) -> str:
    x, w, b = a["input"], a["weight"], a.get("bias")
    if _rank(t, n, x) == 2:
        inputs = [t.tensor(x, n), t.tensor(w, n)] + ([t.tensor(b, n)] if b is not None else [])
        return t.emit(n, "Gemm", inputs, {"transB": 1})
    wt = t.constant(t.value(w, n, "weight").t(), n)
    out = t.emit(n, "MatMul", [t.tensor(x, n), wt], suffix="" if b is None else "matmul")
    return out if b is None else t.emit(n, "Add", [out, t.tensor(b, n)])


def _addmm(t: _Translation, n: Node, a: dict[str, Any]) -> str:
    return t.emit(n, "Gemm", [t.tensor(a["mat1"], n), t.tensor(a["mat2"], n),
                              t.tensor(a["self"], n)],
                  {"alpha": float(a["alpha"]), "beta": float(a["beta"])})


def _matmul(t: _Translation, n: Node, a: dict[str, Any]) -> str:
    other = a.get("mat2", a.get("other"))
    return t.emit(n, "MatMul", [t.tensor(a["self"], n), t.tensor(other, n)])


def _pool_attrs(a: dict[str, Any], n: int = 2) -> dict[str, Any]:
    kernel = _ints(a["kernel_size"], n)
    stride = _ints(a["stride"], n) if a.get("stride") not in (None, []) else kernel
    return {"kernel_shape": kernel, "strides": stride, "pads": _ints(a["padding"], n) * 2,
            "ceil_mode": int(bool(a["ceil_mode"]))}


def _max_pool(t: _Translation, n: Node, a: dict[str, Any]) -> str | list[str]:
    attrs = {**_pool_attrs(a), "dilations": _ints(a["dilation"], 2)}
    out = t.emit(n, "MaxPool", [t.tensor(a["self"], n)], attrs)
    return [out, ""] if _op_name(n.target).endswith("with_indices") else out


def _avg_pool(t: _Translation, n: Node, a: dict[str, Any]) -> str:
    if a.get("divisor_override") is not None:
        raise BoundsUnavailable(_op_name(n.target), "a divisor_override")
    attrs = {**_pool_attrs(a), "count_include_pad": int(bool(a["count_include_pad"]))}
    return t.emit(n, "AveragePool", [t.tensor(a["self"], n)], attrs)


def _adaptive_avg_pool(t: _Translation, n: Node, a: dict[str, Any]) -> str:
    x = a["self"]
    sizes = (_meta_shape(x) or [])[2:]
    out = _ints(a["output_size"], 2)
    if out == [1, 1]:
        return t.emit(n, "GlobalAveragePool", [t.tensor(x, n)])
    if len(sizes) == 2 and all(isinstance(s, int) and s % o == 0 for s, o in zip(
            sizes, out, strict=True)):
        kernel = [int(s) // o for s, o in zip(sizes, out, strict=True)]
        if kernel == [1, 1]:
            return t.tensor(x, n)
        return t.emit(n, "AveragePool", [t.tensor(x, n)],
                      {"kernel_shape": kernel, "strides": kernel})
    raise BoundsUnavailable(_op_name(n.target), f"an output size {out} that does not divide "
                                                f"the input's {sizes}")


def _mean(t: _Translation, n: Node, a: dict[str, Any]) -> str:
    x = a["self"]
    rank = _rank(t, n, x)
    dims = {int(d) % rank for d in (a.get("dim") or range(rank))}
    if rank < 3 or dims != set(range(2, rank)):
        raise BoundsUnavailable(_op_name(n.target), "a mean over other axes than the spatial")
    keep = bool(a.get("keepdim"))
    out = t.emit(n, "GlobalAveragePool", [t.tensor(x, n)], suffix="" if keep else "pool")
    return out if keep else t.emit(n, "Flatten", [out], {"axis": 1})


def _reshape(t: _Translation, n: Node, a: dict[str, Any]) -> str:
    """Any reshape, to the program's recorded output shape, its batch axis copied (ONNX's 0)
    where the recorded input's batch size is the output's."""
    x = n.args[0]
    out, src = _meta_shape(n), _meta_shape(x)
    if out is None:
        raise BoundsUnavailable(_op_name(n.target), "its output shape is not recorded")
    dims = [0 if k == 0 and src and str(d) == str(src[0]) else
            int(d) if isinstance(d, int) else -1 for k, d in enumerate(out)]
    if dims.count(-1) > 1:
        raise BoundsUnavailable(_op_name(n.target), f"a shape {out} with several sizes "
                                                    "computed from the input")
    shape = t.constant(torch.tensor(dims, dtype=torch.int64), n)
    return t.emit(n, "Reshape", [t.tensor(x, n), shape])


def _flatten(t: _Translation, n: Node, a: dict[str, Any]) -> str:
    rank = _rank(t, n, a["self"])
    if rank > 1 and int(a["start_dim"]) % rank == 1 and int(a["end_dim"]) % rank == rank - 1:
        return t.emit(n, "Flatten", [t.tensor(a["self"], n)], {"axis": 1})
    return _reshape(t, n, a)


def _cat(t: _Translation, n: Node, a: dict[str, Any]) -> str:
    return t.emit(n, "Concat", [t.tensor(v, n) for v in a["tensors"]], {"axis": int(a["dim"])})


def _onnx_pads(pad: list[int], rank: int) -> list[int]:
    """torch's pad list (the last axis first, begin and end) as ONNX's ``[begin..., end...]``."""
    begin, end = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        begin[rank - 1 - i], end[rank - 1 - i] = int(pad[2 * i]), int(pad[2 * i + 1])
    return begin + end


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge",
              "circular": "wrap"}


def _pad(t: _Translation, n: Node, a: dict[str, Any]) -> str:
    name = _op_name(n.target)
    x = a["self"]
    pad = a.get("pad", a.get("padding")) or []
    mode = a.get("mode") or ("reflect" if "reflection" in name else
                             "replicate" if "replication" in name else "constant")
    if mode not in _PAD_MODES:
        raise BoundsUnavailable(name, f"the {mode} mode")
    pads = t.constant(torch.tensor(_onnx_pads(list(pad), _rank(t, n, x)), dtype=torch.int64),
                      n)
    inputs = [t.tensor(x, n), pads]
    if mode == "constant":
        inputs.append(t.tensor(float(a.get("value") or 0.0), n))
    return t.emit(n, "Pad", inputs, {"mode": _PAD_MODES[mode]})


def _scaled(t: _Translation, n: Node, v: Any, alpha: Any) -> str:
    """``alpha · v`` as a tensor of the table (``v`` itself for an ``alpha`` of 1)."""
    if alpha is None or float(alpha) == 1.0:
        return t.tensor(v, n)
    if isinstance(v, Node) and v in t.variable:
        return t.emit(n, "Mul", [t.tensor(v, n), t.tensor(float(alpha), n)], suffix="alpha")
    value = t.values[v] if isinstance(v, Node) and v in t.values else v
    return t.constant(torch.as_tensor(value, dtype=torch.float64) * float(alpha), n)


def _arith(op_type: str, reverse: bool = False) -> Converter:
    def convert(t: _Translation, n: Node, a: dict[str, Any]) -> str:
        if a.get("rounding_mode") is not None:
            raise BoundsUnavailable(_op_name(n.target), "a rounding mode")
        if reverse:  # rsub: other − alpha · self
            return t.emit(n, op_type, [t.tensor(a["other"], n),
                                       _scaled(t, n, a["self"], a.get("alpha"))])
        return t.emit(n, op_type, [t.tensor(a["self"], n),
                                   _scaled(t, n, a["other"], a.get("alpha"))])
    return convert


def _unary(op_type: str, **attrs: str) -> Converter:
    """An operator of one tensor; ``attrs``: ONNX attribute ← aten argument."""
    def convert(t: _Translation, n: Node, a: dict[str, Any]) -> str:
        x = a.get("self", a.get("input"))
        return t.emit(n, op_type, [t.tensor(x, n)],
                      {k: float(a[v]) for k, v in attrs.items()})
    return convert


def _batch_norm(t: _Translation, n: Node, a: dict[str, Any]) -> str | list[str]:
    name = _op_name(n.target)
    if a.get("training") or a.get("running_mean") is None or a.get("running_var") is None:
        raise BoundsUnavailable(name, "normalised by the batch's statistics (training)")
    channels = t.value(a["running_mean"], n, "running mean").numel()
    weight, bias = a.get("weight"), a.get("bias")
    inputs = [t.tensor(a["input"], n),
              t.tensor(weight, n) if weight is not None else
              t.constant(torch.ones(channels, dtype=torch.float64), n),
              t.tensor(bias, n) if bias is not None else
              t.constant(torch.zeros(channels, dtype=torch.float64), n),
              t.tensor(a["running_mean"], n), t.tensor(a["running_var"], n)]
    out = t.emit(n, "BatchNormalization", inputs, {"epsilon": float(a["eps"])})
    return out if name == "aten.batch_norm" else [out, "", ""]


def _dropout(t: _Translation, n: Node, a: dict[str, Any]) -> str:
    if a.get("train"):
        raise BoundsUnavailable(_op_name(n.target), "dropout in training mode")
    return t.tensor(a["input"], n)


def _same(t: _Translation, n: Node, a: dict[str, Any]) -> str:
    """An operation that leaves the values as they are."""
    return t.tensor(n.args[0], n)


def _softmax(op_type: str) -> Converter:
    def convert(t: _Translation, n: Node, a: dict[str, Any]) -> str:
        return t.emit(n, op_type, [t.tensor(a["self"], n)], {"axis": int(a["dim"])})
    return convert


_CONVERTERS: dict[str, Converter] = {
    "aten.conv1d": _conv, "aten.conv2d": _conv, "aten.conv3d": _conv,
    "aten.convolution": _conv, "aten._convolution": _conv,
    "aten.linear": _linear, "aten.addmm": _addmm, "aten.mm": _matmul, "aten.matmul": _matmul,
    "aten.relu": _unary("Relu"), "aten.leaky_relu": _unary("LeakyRelu", alpha="negative_slope"),
    "aten.max_pool2d": _max_pool, "aten.max_pool2d_with_indices": _max_pool,
    "aten.avg_pool2d": _avg_pool, "aten.adaptive_avg_pool2d": _adaptive_avg_pool,
    "aten._adaptive_avg_pool2d": _adaptive_avg_pool, "aten.mean": _mean,
    "aten.flatten": _flatten, "aten.view": _reshape, "aten.reshape": _reshape,
    "aten._unsafe_view": _reshape, "aten.squeeze": _reshape, "aten.unsqueeze": _reshape,
    "aten.cat": _cat, "aten.constant_pad_nd": _pad, "aten.pad": _pad,
    "aten.reflection_pad1d": _pad, "aten.reflection_pad2d": _pad,
    "aten.reflection_pad3d": _pad, "aten.replication_pad1d": _pad,
    "aten.replication_pad2d": _pad, "aten.replication_pad3d": _pad,
    "aten.add": _arith("Add"), "aten.sub": _arith("Sub"), "aten.rsub": _arith("Sub", True),
    "aten.mul": _arith("Mul"), "aten.div": _arith("Div"), "aten.neg": _unary("Neg"),
    "aten.batch_norm": _batch_norm, "aten._native_batch_norm_legit_no_training": _batch_norm,
    "aten.native_batch_norm": _batch_norm,
    "aten.dropout": _dropout, "aten.feature_dropout": _dropout,
    "aten.alpha_dropout": _dropout, "aten.feature_alpha_dropout": _dropout,
    "aten.clone": _same, "aten.detach": _same, "aten.contiguous": _same, "aten.alias": _same,
    "aten.lift_fresh_copy": _same,
    "aten.softmax": _softmax("Softmax"), "aten._softmax": _softmax("Softmax"),
    "aten.log_softmax": _softmax("LogSoftmax"), "aten._log_softmax": _softmax("LogSoftmax"),
}


# -- the check against the program ---------------------------------------------------------

class _Compare(torch.fx.Interpreter):
    """Runs the program, comparing each translated node's value with the table's as it is
    computed (before an in-place operation can change it)."""

    def __init__(self, gm: torch.fx.GraphModule, expected: dict[Node, torch.Tensor]) -> None:
        super().__init__(gm)
        self.expected = expected

    def run_node(self, n: Node) -> Any:
        out = super().run_node(n)
        want = self.expected.get(n)
        if want is not None and isinstance(out, torch.Tensor):
            got = out.detach().cpu().to(torch.float64)
            scale = 1.0 + float(got.abs().max()) if got.numel() else 1.0
            diff = float((got - want).abs().max()) if got.shape == want.shape and \
                got.numel() else (0.0 if got.shape == want.shape else float("inf"))
            if not diff <= CHECK_TOLERANCE * scale:
                raise BoundsUnavailable(_op_name(n.target), "the table does not reproduce it "
                                        f"(a difference of {diff:.3g} at a random input)")
        return out


def _check_values(gm: torch.fx.GraphModule, graph: BoundGraph, t: _Translation) -> None:
    """Every translated tensor against the program's own at a random input of its recorded
    shape (module docstring)."""
    node = t.placeholder
    val = node.meta.get("val") if node is not None else None
    if node is None or not isinstance(val, torch.Tensor) or not val.is_floating_point():
        return  # nothing recorded to draw an input from
    shape = []
    for d in val.shape:
        hint = d if isinstance(d, int) else getattr(d.node, "hint", None)
        shape.append(int(hint) if hint is not None else 1)
    u = torch.rand(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    env = graph.evaluate(u)
    expected = {n: env[name] for n, name in t.computed.items() if name in env}
    device = next((v.device for v in gm.state_dict().values()
                   if isinstance(v, torch.Tensor)), torch.device("cpu"))
    with torch.no_grad():
        _Compare(gm, expected).run(u.to(device=device, dtype=val.dtype))
