"""ONNX's own node tests as the conformance suite of certify's ONNX-to-torch converter.

The onnx wheel ships the generators of its backend node tests
(``onnx.backend.test.case.node``): each case is a small graph with input and expected output
data. Every case the converter could meet in an image classifier is run through
:func:`certify.models.torchcopy.run_nodes` (the loop :class:`~certify.models.torchcopy.TorchCopy`
runs, each operator taken at the case's opset by ``op_for``) and compared with ONNX's expected
outputs.

Which cases are in scope:

* every node of the graph is an operator of :data:`~certify.models.onnx_ops.OPS` (default
  domain);
* every graph input and output is a tensor of a type image models carry (:func:`_dtype_ok`):
  float32, float16 and float64 (the copy computes both in float32), int64 and int32 (shapes
  and indices; TensorFlow exports write int32), bool; uint8 and int8 only in graphs with a
  QuantizeLinear or DequantizeLinear node (quantised tensors). Other types (uint16..uint64,
  int16, 8-bit integers elsewhere, float8/float4/int4/bfloat16, sequences, optionals) are out
  of scope;
* the case is not named in :data:`EXCLUDED` (each with its reason).

Each in-scope case runs once, in the test of the alphabetically first operator type among its
graph's nodes (a single-operator case in its operator's test; an expanded function's graph in
the test of its first operator by name).

Comparison: floating outputs by value (the copy's float is float32, whatever the graph says)
within the case's ``rtol`` and ``max(atol, 1e-5)`` (``1e-3`` both where the case has float16
data); integer outputs exactly, and integer-typed; bool outputs exactly, and bool-typed; shapes
exactly.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
import torch

from certify.models.onnx_ops import OPS, tensor
from certify.models.torchcopy import Env, WhiteBoxUnavailable, read_nodes, run_nodes

#: every test: one xdist worker collects the cases once (``-n 2 --dist loadgroup``)
pytestmark = [pytest.mark.unit, pytest.mark.xdist_group("onnx_conformance")]

P = onnx.TensorProto
#: Element types of an image model's tensors, in every case.
IMAGE_TYPES = frozenset({P.FLOAT, P.FLOAT16, P.DOUBLE, P.INT64, P.INT32, P.BOOL})
#: Quantised tensors' types: in scope in a graph that quantises or dequantises.
QUANT_TYPES = frozenset({P.UINT8, P.INT8})
QUANT_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})

#: In-scope cases (by the operator and type rules) that are not run, and why.
EXCLUDED: dict[str, str] = {
    "test_training_dropout": "Training-mode Dropout draws a random mask; the copy is the "
                             "expectation (the identity).",
    "test_training_dropout_mask": "Training-mode Dropout draws a random mask; the copy is the "
                                  "expectation (the identity).",
    "test_training_dropout_default": "Training-mode Dropout draws a random mask; the copy is "
                                     "the expectation (the identity).",
    "test_training_dropout_default_mask": "Training-mode Dropout draws a random mask; the copy "
                                          "is the expectation (the identity).",
}


@functools.lru_cache(maxsize=1)
def _cases() -> tuple[Any, ...]:
    """ONNX's node test cases (collected once per process; the generators warn as they run)."""
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(collect_testcases(None))


def _elem_types(graph: onnx.GraphProto) -> list[int] | None:
    """The element types of the graph's inputs and outputs (``None``: one is not a tensor)."""
    types = []
    for value in [*graph.input, *graph.output]:
        if value.type.WhichOneof("value") != "tensor_type":
            return None
        types.append(value.type.tensor_type.elem_type)
    return types


def _dtype_ok(graph: onnx.GraphProto) -> bool:
    """The type rule (the module's docstring)."""
    types = _elem_types(graph)
    if types is None:
        return False
    allowed = IMAGE_TYPES | (QUANT_TYPES if {n.op_type for n in graph.node} & QUANT_OPS
                             else frozenset())
    return all(t in allowed for t in types)


def _ops_ok(graph: onnx.GraphProto) -> bool:
    return all(n.op_type in OPS and n.domain in ("", "ai.onnx") for n in graph.node)


def _candidates() -> list[Any]:
    """The cases in scope by the operator and type rules (``EXCLUDED`` included)."""
    return [c for c in _cases()
            if c.model is not None and _ops_ok(c.model.graph) and _dtype_ok(c.model.graph)]


def _owner(case: Any) -> str:
    """The operator whose test runs ``case`` (the module's docstring)."""
    return min(n.op_type for n in case.model.graph.node)


def _in_scope() -> list[Any]:
    return [c for c in _candidates() if c.name not in EXCLUDED]


def _array(value: Any) -> np.ndarray:
    return onnx.numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) \
        else np.asarray(value)


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _compare(name: str, got: torch.Tensor, want: np.ndarray, rtol: float, atol: float
             ) -> str | None:
    """Why ``got`` is not ONNX's ``want`` (``None``: it is)."""
    if tuple(got.shape) != want.shape:
        return f"{name}: shape {tuple(got.shape)}, expected {want.shape}"
    g = got.detach().cpu()
    if want.dtype == np.bool_:
        if g.dtype != torch.bool:
            return f"{name}: {g.dtype}, expected bool"
        wrong = int((g.numpy() != want).sum())
        return f"{name}: {wrong} value(s) differ" if wrong else None
    if np.issubdtype(want.dtype, np.integer):
        if g.is_floating_point() or g.dtype == torch.bool or g.is_complex():
            return f"{name}: {g.dtype}, expected an integer type ({want.dtype})"
        diff = np.abs(g.numpy().astype(np.int64) - want.astype(np.int64))
        return f"{name}: max |Δ| {diff.max()}" if diff.size and diff.max() else None
    if not g.is_floating_point():
        return f"{name}: {g.dtype}, expected a floating type ({want.dtype})"
    a, b = g.double().numpy(), want.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # infinities compare, not subtract
        close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        if close.all():
            return None
        err = np.abs(a - b)[~close]
    return f"{name}: {int((~close).sum())} value(s) beyond tolerance, max |Δ| {np.nanmax(err):.3g}"


def _run_case(case: Any) -> list[str]:
    """Every way the converter's answer differs from ONNX's on ``case`` (empty: none)."""
    graph = case.model.graph
    nodes = read_nodes(graph, _opset(case.model))
    if not case.data_sets:
        return [f"{case.name}: no data set"]
    half = P.FLOAT16 in (_elem_types(graph) or [])
    rtol = max(case.rtol, 1e-3) if half else case.rtol
    atol = max(case.atol, 1e-3 if half else 1e-5)
    problems = []
    for k, (inputs, outputs) in enumerate(case.data_sets):
        env: Env = {i.name: tensor(onnx.numpy_helper.to_array(i)) for i in graph.initializer}
        for value, data in zip(graph.input, inputs, strict=False):
            if value.name and data is not None:
                env[value.name] = tensor(_array(data))
        where = f"{case.name}[{k}]"
        if len(outputs) != len(graph.output):
            problems.append(f"{where}: {len(outputs)} expected outputs for "
                            f"{len(graph.output)} graph outputs")
            continue
        try:
            with torch.no_grad():
                env = run_nodes(nodes, env)
        except WhiteBoxUnavailable as exc:
            problems.append(f"{where}: {exc}")
            continue
        for value, want in zip(graph.output, outputs, strict=True):
            if value.name not in env:
                problems.append(f"{where} {value.name}: not computed")
                continue
            why = _compare(value.name, env[value.name], _array(want), rtol, atol)
            if why is not None:
                problems.append(f"{where} {why}")
    return problems


@pytest.mark.parametrize("op_type", sorted(OPS))
def test_operator_matches_onnx_node_tests(op_type: str) -> None:
    """Every in-scope ONNX node test case owned by ``op_type`` gives ONNX's outputs; a failure
    lists every failing case."""
    cases = [c for c in _in_scope() if _owner(c) == op_type]
    if not cases:
        pytest.skip(f"no in-scope ONNX node test case is owned by {op_type}")
    problems = [p for c in cases for p in _run_case(c)]
    assert not problems, (f"{len(problems)} problem(s) in {len(cases)} case(s) of {op_type}:\n"
                          + "\n".join(problems))


def test_every_case_in_scope_runs_once_and_exclusions_are_current() -> None:
    """Each excluded name is a case the rules would otherwise run; each case in scope belongs
    to exactly one operator's test (none is left out silently)."""
    names = [c.name for c in _cases()]
    assert len(names) == len(set(names))
    candidates = {c.name for c in _candidates()}
    stale = sorted(set(EXCLUDED) - candidates)
    assert not stale, f"EXCLUDED names no in-scope case (drop them): {stale}"
    assert all(reason.endswith(".") for reason in EXCLUDED.values())
    scope = _in_scope()
    owned = [c for op in sorted(OPS) for c in scope if _owner(c) == op]
    assert len(owned) == len(scope) == len(candidates) - len(EXCLUDED)
    assert len(scope) > 250, f"only {len(scope)} ONNX node test cases in scope"


def _one_node_model(node: Any, inputs: dict[str, np.ndarray], out_type: int,
                    inits: dict[str, np.ndarray], opset: int) -> onnx.ModelProto:
    """A graph of ``node`` (or a list of nodes, the last one's output answered)."""
    nodes = node if isinstance(node, list) else [node]
    node = nodes[-1]
    graph = onnx.helper.make_graph(
        nodes, "g",
        [onnx.helper.make_tensor_value_info(k, onnx.helper.np_dtype_to_tensor_dtype(v.dtype),
                                            v.shape) for k, v in inputs.items()],
        [onnx.helper.make_tensor_value_info(node.output[0], out_type, None)],
        [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)],
                                  ir_version=8)


def _ours_and_onnxruntime(model: onnx.ModelProto, inputs: dict[str, np.ndarray]
                          ) -> tuple[np.ndarray, np.ndarray]:
    import onnxruntime as ort
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    env: Env = {k: tensor(v) for k, v in inputs.items()}
    env.update({i.name: tensor(onnx.numpy_helper.to_array(i)) for i in model.graph.initializer})
    got = run_nodes(read_nodes(model.graph, 13), env)[model.graph.output[0].name]
    return got.detach().numpy(), want


def test_slice_matches_onnxruntime_on_every_bound_and_step() -> None:
    """Slice's clamping against onnxruntime (the judge of every candidate) on a grid of starts,
    ends and steps, the sentinels exporters write (INT64_MIN, INT64_MAX) included; ONNX's node
    tests cover few of these, and an empty result is a result."""
    big = 2**63 - 1
    bounds = [-big - 1, -7, -1, 0, 2, 4, 5, 9, big]
    x = np.arange(5, dtype=np.float32)
    failures = []
    for start in bounds:
        for end in bounds:
            for step in (-3, -1, 1, 2):
                inits = {k: np.array([v], np.int64)
                         for k, v in (("s", start), ("e", end), ("a", 0), ("st", step))}
                node = onnx.helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])
                got, want = _ours_and_onnxruntime(
                    _one_node_model(node, {"x": x}, P.FLOAT, inits, 13), {"x": x})
                if got.shape != want.shape or not np.array_equal(got, want):
                    failures.append((start, end, step, got.tolist(), want.tolist()))
    assert not failures, failures[:5]


@pytest.mark.parametrize("to", [P.FLOAT16, P.BFLOAT16])
def test_a_cast_to_16_bit_floats_rounds_as_onnxruntime(to: int) -> None:
    """The copy holds float16 and bfloat16 in float32 but rounds as the cast does (and a cast
    to a type it cannot hold fails instead of truncating)."""
    x = (np.random.default_rng(0).normal(size=64) * 3).astype(np.float32)
    nodes = [onnx.helper.make_node("Cast", ["x"], ["h"], to=to),
             onnx.helper.make_node("Cast", ["h"], ["y"], to=P.FLOAT)]  # numpy has no bfloat16
    got, want = _ours_and_onnxruntime(_one_node_model(nodes, {"x": x}, P.FLOAT, {}, 13),
                                      {"x": x})
    assert np.array_equal(got, want) and not np.array_equal(got, x)
    with pytest.raises(WhiteBoxUnavailable, match="not supported"):
        run_nodes(read_nodes(onnx.helper.make_graph(
            [onnx.helper.make_node("Cast", ["x"], ["y"], to=P.FLOAT8E4M3FN)], "g", [], []), 19),
            {"x": torch.from_numpy(x)})
