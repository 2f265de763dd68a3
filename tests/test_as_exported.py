"""Models exactly as teams export them (issue 49): ``torch.onnx.export`` at its default batch of
1 with either exporter, graphs that are legal only one image at a time, torch copies that fail,
opset-11 heads, and ``certify init`` on a CIFAR-normalised model.

Each run is the CLI in-process on a 43-class tiny CNN and a small suite (clean accuracy and a
short APGD-CE), so that a row that ERRORs, a row SKIPPED and a run with no card are told apart.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.helper
import onnxruntime as ort
import pytest
import torch
import yaml
from torch import nn

from certify.device import choose_device
from certify.models import load_model, torchcopy
from certify.probe import STATISTICS

import builders

#: The short white-box suite: every sample the attack gets is also clean-checked.
SUITE = {"name": "as-exported", "seed": 0, "classes": builders.CLASSES, "checks": [
    {"id": "clean", "kind": "clean_accuracy", "threshold": {"metric": "accuracy", "min": 0.0}},
    {"id": "apgd_linf", "kind": "attack", "samples": 24,
     "params": {"attack": "apgd_ce", "norm": "linf", "epsilon": 0.01, "eps_sweep": False,
                "attack_params": {"iterations": 20, "restarts": 1}},
     "threshold": {"metric": "robust_accuracy", "min": 0.5}},
]}


class ViewNet(nn.Module):
    """The tiny CNN flattened the way most classifiers are written, ``x.view(x.size(0), -1)``:
    at batch 1 the exporters write a Reshape whose shape holds the 1."""

    def __init__(self) -> None:
        super().__init__()
        self.net = builders.make_net(seed=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.net.features(x)
        return self.net.head(f.view(f.size(0), -1))


def _export(module: nn.Module, path: Path, dynamo: bool, dynamic: bool = False) -> Path:
    """``torch.onnx.export`` as a user calls it: one example image, the exporter's defaults
    (the dynamo exporter writes its weights beside the graph, as ``.onnx.data``)."""
    x = torch.rand(1, 3, 32, 32)
    kwargs: dict[str, Any] = {"dynamo": dynamo}
    if dynamic:
        kwargs.update(input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (x,), str(path), **kwargs)
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("as_exported")
    net = ViewNet().eval()
    (root / "suite.yaml").write_text(yaml.safe_dump(SUITE))
    builders.write_labelled_npz(net, root / "d.npz", 48, seed=11)
    return {"root": root, "suite": root / "suite.yaml", "data": root / "d.npz",
            "dynamic": _export(net, root / "dynamic.onnx", dynamo=False, dynamic=True)}


def _run(setup: dict[str, Path], model: Path, name: str, *extra: str) -> tuple[Any, dict]:
    out = setup["root"] / name
    proc = builders.run_cli("run", model, "--suite", setup["suite"], "--data", setup["data"],
                            "--out", out, "--no-pdf", *extra)
    assert (out / "card.html").is_file(), proc.stderr[-2000:]
    return proc, json.loads((out / "results.json").read_text())["measurement"]


def _checks(measurement: dict) -> dict[str, dict]:
    return {c["id"]: c for c in measurement["checks"]}


@pytest.fixture(scope="module")
def dynamic_run(setup: dict[str, Path]) -> dict:
    proc, m = _run(setup, setup["dynamic"], "run-dynamic")
    assert proc.returncode in (0, 1, 6, 7), proc.stderr[-2000:]
    assert m["model"]["batch"] == "dynamic"
    return m


@pytest.mark.e2e
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript-exporter", "dynamo"])
def test_a_default_export_at_batch_1_gets_the_dynamic_exports_card(
        setup: dict[str, Path], dynamic_run: dict, dynamo: bool) -> None:
    model = _export(ViewNet(), setup["root"] / f"b1-{dynamo}.onnx", dynamo=dynamo)
    proc, m = _run(setup, model, f"run-b1-{dynamo}")
    assert proc.returncode == 6, proc.stderr[-2000:]  # INCONCLUSIVE, like the dynamic export
    assert m["model"]["batch"] == "symbolic (rewritten from fixed 1)"
    assert "shape inference" in m["model"]["metadata"]["batching"]
    mine, ref = _checks(m), _checks(dynamic_run)
    for cid in ("clean", "apgd_linf"):
        assert mine[cid]["status"] == ref[cid]["status"] not in ("ERROR", "SKIPPED"), cid
        assert mine[cid]["outcomes"] == ref[cid]["outcomes"], cid
    assert mine["apgd_linf"]["metrics"]["robust_accuracy"] == \
        ref["apgd_linf"]["metrics"]["robust_accuracy"]
    assert mine["apgd_linf"]["metrics"]["gradient_evaluations"] > 0


@pytest.mark.e2e
def test_a_graph_legal_only_at_batch_1_is_run_one_image_at_a_time(
        setup: dict[str, Path]) -> None:
    """A graph whose answer depends on the whole input tensor: clean accuracy is onnxruntime's
    one image at a time, and the white-box rows run on the torch copy mapped over images."""
    net = builders.WholeInput(ViewNet()).eval()
    model = _export(net, setup["root"] / "whole.onnx", dynamo=False)
    proc, m = _run(setup, model, "run-whole")
    assert proc.returncode in (0, 1, 6, 7), proc.stderr[-2000:]
    assert m["model"]["batch"] == "fixed 1 (chunked)"
    assert "torch.func.vmap" in m["model"]["metadata"]["batching"]
    data = np.load(setup["data"])
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    x = data["x"].astype(np.float32).transpose(0, 3, 1, 2) / 255
    name = sess.get_inputs()[0].name
    one_at_a_time = np.mean([int(sess.run(None, {name: x[i:i + 1]})[0].argmax()) == y
                             for i, y in enumerate(data["y"])])
    checks = _checks(m)
    assert checks["clean"]["metrics"]["accuracy"] == pytest.approx(one_at_a_time, abs=1e-9)
    assert checks["apgd_linf"]["status"] not in ("ERROR", "SKIPPED")
    assert checks["apgd_linf"]["metrics"]["gradient_evaluations"] > 0


@pytest.mark.unit
def test_the_copy_of_a_batch_1_graph_maps_images_like_a_loop(tmp_path: Path) -> None:
    """The torch copy of a graph fixed at batch 1 (and unprovable) equals a per-image loop, in
    its answers and its gradients."""
    net = builders.WholeInput(ViewNet()).eval()
    model = load_model(str(_export(net, tmp_path / "w.onnx", dynamo=False)),
                       choose_device("cpu"))
    copy = model.torch_copy()  # type: ignore[attr-defined]
    assert copy.fixed_batch == 1
    x = torch.rand(5, 3, 32, 32)

    def loss(z: torch.Tensor) -> torch.Tensor:
        return z[:, 3] - z[:, 7]

    scores, cut, value, grad = copy.value_and_grad(x, loss)
    loop = [copy.value_and_grad(x[i:i + 1], loss) for i in range(len(x))]
    for k, got in enumerate((scores, cut, value, grad)):
        assert torch.allclose(got, torch.cat([r[k] for r in loop]), atol=1e-6), k
    with torch.no_grad():
        want = torch.cat([net(x[i:i + 1]) for i in range(len(x))])
    assert torch.allclose(scores, want, atol=1e-5)
    assert torch.allclose(model.predict(x), want, atol=1e-5)
    assert copy.scores(x[:0]).shape == (0, 43)  # vmap maps no empty batch: shapes kept
    model.close()


def _failing_relu(at_most: int) -> torchcopy.Op:
    """A Relu converter that fails on batches of more than ``at_most`` images (a copy that
    works on the plan's few images and fails on an attack's batch)."""
    def op(args: list[torch.Tensor | None], attrs: dict[str, Any]) -> list[torch.Tensor]:
        x = args[0]
        assert x is not None
        if len(x) > at_most:
            raise RuntimeError("planted failure of the converter")
        return [torch.relu(x)]
    return op


@pytest.mark.e2e
def test_a_torch_copy_that_fails_skips_its_rows_and_the_card_is_written(
        setup: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(torchcopy._OPS, "Relu", _failing_relu(0))
    proc, m = _run(setup, setup["dynamic"], "run-copy-fails")
    assert proc.returncode in (0, 1, 7), proc.stderr[-2000:]
    checks = _checks(m)
    assert checks["clean"]["status"] == "PASS"
    apgd = checks["apgd_linf"]
    assert apgd["status"] == "SKIPPED" and apgd["queries"]["total"] == 0
    assert "failed on real images before the first check" in apgd["decision"]
    assert "planted failure of the converter" in apgd["decision"]
    assert m["model"]["white_box"].startswith("unavailable: the white-box path failed")


@pytest.mark.e2e
def test_a_torch_copy_that_fails_mid_check_errors_its_row_only(
        setup: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(torchcopy._OPS, "Relu", _failing_relu(8))  # the plan tries 8 images
    proc, m = _run(setup, setup["dynamic"], "run-copy-fails-later")
    assert proc.returncode == 5, proc.stderr[-2000:]  # an ERROR row: the card says so
    checks = _checks(m)
    assert checks["clean"]["status"] == "PASS"
    assert checks["apgd_linf"]["status"] == "ERROR"
    assert "planted failure of the converter" in checks["apgd_linf"]["error"]


#: One small case per converter operation: (data inputs with a leading batch axis, constant
#: inputs, attributes). A new operation needs a case here: the test below maps each one over
#: a batch with torch.func.vmap, which refuses any Python read of a batched value.
def _op_cases() -> dict[str, tuple[list[Any], dict[str, Any]]]:
    t = torch.tensor
    img = (1, 2, 4, 4)
    return {
        "Conv": ([img, t(np.ones((3, 2, 3, 3), np.float32)), t([0.1, 0.2, 0.3])],
                 {"pads": [1, 1, 1, 1]}),
        "Gemm": ([(1, 4), t(np.ones((4, 3), np.float32)), t([1.0, 2.0, 3.0])], {}),
        "MaxPool": ([img], {"kernel_shape": [2, 2], "strides": [2, 2]}),
        "AveragePool": ([img], {"kernel_shape": [2, 2], "strides": [2, 2]}),
        "GlobalAveragePool": ([img], {}), "GlobalMaxPool": ([img], {}),
        "MatMul": ([(1, 4), t(np.ones((4, 3), np.float32))], {}),
        **{op: ([img, img], {}) for op in ("Add", "Sub", "Mul", "Div", "Max", "Min")},
        "Pow": ([img, t(2.0)], {}),
        **{op: ([img], {}) for op in (
            "Relu", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "HardSigmoid", "HardSwish", "Erf",
            "Exp", "Neg", "Abs", "Round", "Floor", "Ceil", "Identity", "Dropout", "Log",
            "Sqrt", "Reciprocal")},
        "Flatten": ([img], {"axis": 1}),
        "Reshape": ([img, t([1, -1])], {}),
        "Squeeze": ([(1, 2, 1, 4), t([2])], {}),
        "Unsqueeze": ([img, t([1])], {}),
        "Transpose": ([img], {"perm": [0, 2, 3, 1]}),
        "Concat": ([img, img], {"axis": 1}),
        "Shape": ([img], {}),
        "Gather": ([(1, 6), t([4, 0, 2])], {"axis": 1}),
        "Constant": ([], {"value": onnx.numpy_helper.from_array(np.ones(3, np.float32))}),
        "BatchNormalization": ([img, t([1.0, 2.0]), t([0.1, 0.2]), t([0.0, 0.5]),
                                t([1.0, 2.0])], {}),
        "Clip": ([img, t(0.2), t(0.7)], {}),
        "Softmax": ([(1, 5)], {"axis": 1}), "LogSoftmax": ([(1, 5)], {"axis": 1}),
        "Hardmax": ([(1, 5)], {"axis": 1}),
        "Cast": ([img], {"to": onnx.TensorProto.INT64}),
        "ArgMax": ([(1, 5)], {"axis": 1}),
        "TopK": ([(1, 5), t([2])], {"axis": 1}),
        "Pad": ([img, t([0, 0, 1, 1, 0, 0, 1, 1])], {}),
        "ReduceMean": ([img, t([2, 3])], {}), "ReduceSum": ([img, t([1])], {}),
        "QuantizeLinear": ([img, t(0.05), t(128, dtype=torch.uint8)], {}),
        "DequantizeLinear": ([img, t(0.05), t(3.0)], {}),
        # the operators of transformer exports, comparisons, logic and shape arithmetic
        "LayerNormalization": ([(1, 3, 4), t([1.0, 2.0, 3.0, 4.0]), t([0.0, 0.1, 0.2, 0.3])],
                               {"axis": -1}),
        "Gelu": ([img], {}), "ConstantOfShape": ([t([3])], {}),
        "Expand": ([(1, 1, 4), t([1, 3, 4])], {}),
        "Where": ([img, img, img], {}), "Mod": ([img, img], {"fmod": 1}),
        "Slice": ([(1, 6, 4), t([1, -1]), t([5, 0]), t([1, 2]), t([2, -1])], {}),
        "Range": ([t(0.0), t(3.0), t(1.0)], {}),
        "Tile": ([(1, 2, 3), t([1, 2, 1])], {}),
        "Split": ([(1, 6, 2), t([2, 4])], {"axis": 1}),
        "Einsum": ([(1, 2, 3), (1, 3, 4)], {"equation": "bij,bjk->bik"}),
        "ScatterND": ([(1, 4, 3), t([[0, 1], [0, 3]]), t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])],
                      {}),
        "PRelu": ([img, t([0.1, 0.2]).reshape(2, 1, 1)], {}),
        "IsInf": ([img], {}),
        **{op: ([img], {}) for op in ("IsNaN", "Softplus", "Sign", "Sin", "Cos", "Not")},
        **{op: ([img, img], {}) for op in ("Equal", "Less", "Greater", "LessOrEqual",
                                           "GreaterOrEqual", "And", "Or", "Xor", "Sum",
                                           "Mean")},
        **{op: ([img, t([2, 3])], {}) for op in ("ReduceMax", "ReduceMin", "ReduceProd",
                                                  "ReduceL2")},
    }


@pytest.mark.unit
def test_every_converter_operation_maps_over_a_batch_with_vmap() -> None:
    cases = _op_cases()
    assert set(cases) == set(torchcopy._OPS), "give each converter operation a case above"
    gen = torch.Generator().manual_seed(0)
    for op_type, (inputs, attrs) in cases.items():
        op = torchcopy._OPS[op_type]
        data = [torch.rand(3, *shape, generator=gen) for shape in inputs
                if isinstance(shape, tuple)]
        consts = [v for v in inputs if not isinstance(v, tuple)]
        if op_type in ("Sqrt", "Log", "Reciprocal", "Pow", "Mod"):
            data = [d + 0.5 for d in data]

        def one(*xs: torch.Tensor, op: Any = op, attrs: dict[str, Any] = attrs,
                consts: list[Any] = consts) -> tuple[torch.Tensor, ...]:
            return tuple(op([*xs, *consts], attrs))
        if not data:  # Constant: nothing to map, only to run
            assert one()[0].shape == (3,)
            continue
        mapped = torch.func.vmap(one)(*data)
        loop = [one(*(d[i] for d in data)) for i in range(3)]
        for k, got in enumerate(mapped):
            want = torch.stack([r[k] for r in loop])
            assert torch.equal(got, want) or torch.allclose(got.float(), want.float()), op_type


def _single_node(op: str, opset: int, axis: int | None, shape: list[int]) -> onnx.ModelProto:
    attrs = {} if axis is None else {"axis": axis}
    node = onnx.helper.make_node(op, ["x"], ["y"], **attrs)
    graph = onnx.helper.make_graph(
        [node], "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape)])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)],
                                  ir_version=8)


@pytest.mark.unit
@pytest.mark.parametrize("opset", [11, 12, 13])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_softmax_family_keeps_its_opset_semantics(op: str, opset: int) -> None:
    """Before opset 13 these operations flatten the input from ``axis`` (default 1) on; from
    13 they act along ``axis`` (default -1): the copy matches onnxruntime at each."""
    x = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32) * 3
    for axis in (None, 0, 1, 2, -1):
        model = _single_node(op, opset, axis, [2, 3, 4])
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        want = sess.run(None, {"x": x})[0]
        attrs = {} if axis is None else {"axis": axis}
        got = torchcopy.op_for(op, opset)([torch.from_numpy(x)], attrs)[0].numpy()
        assert np.allclose(got, want, atol=1e-6), (op, opset, axis, np.abs(got - want).max())


def _cifar_model(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny CNN whose labels are its own answers on CIFAR-10-normalised images."""
    _, mean, std = next(s for s in STATISTICS if s[0] == "CIFAR-10 mean/std")
    net = builders.make_net(seed=0)
    images = builders.make_images(64, seed=5)
    x = torch.from_numpy(images.transpose(0, 3, 1, 2).copy()).float() / 255
    with torch.no_grad():
        y = net((x - torch.tensor(mean).view(1, 3, 1, 1))
                / torch.tensor(std).view(1, 3, 1, 1)).argmax(1)
    np.savez(tmp_path / "cifar.npz", x=images, y=y.numpy())
    return builders.export(net, tmp_path / "cifar.onnx"), tmp_path / "cifar.npz"


@pytest.mark.e2e
def test_init_picks_cifar_statistics_on_a_cifar_normalised_model(tmp_path: Path) -> None:
    model, data = _cifar_model(tmp_path)
    out = tmp_path / "suite.yaml"
    proc = builders.run_cli("init", model, "--data", data, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "best: CIFAR-10 mean/std, RGB, NCHW with 100.0%" in proc.stdout
    pre = yaml.safe_load(out.read_text())["preprocessing"]
    _, mean, std = next(s for s in STATISTICS if s[0] == "CIFAR-10 mean/std")
    assert pre["mean"] == pytest.approx(list(mean)) and pre["std"] == pytest.approx(list(std))
    assert "even the best candidate" not in proc.stdout


@pytest.mark.e2e
def test_init_says_when_no_candidate_is_close_to_the_labels(tmp_path: Path) -> None:
    """Labels from a preprocessing none of the candidates is (the negative image, (0.5 - x) /
    0.25): the best candidate's accuracy interval lies below one half, and init says so with
    the flags that state one by hand. (Its stated rule: a candidate right on most labels fits;
    a normalisation near a candidate's, such as mean 0.3 and std 0.1, gives the same answers
    to most images and is not warned about.)"""
    net = builders.make_net(seed=0)
    images = builders.make_images(64, seed=5)
    x = torch.from_numpy(images.transpose(0, 3, 1, 2).copy()).float() / 255
    with torch.no_grad():
        y = net((0.5 - x) / 0.25).argmax(1)
    np.savez(tmp_path / "odd.npz", x=images, y=y.numpy())
    model = builders.export(net, tmp_path / "odd.onnx")
    proc = builders.run_cli("init", model, "--data", tmp_path / "odd.npz", "--out",
                            tmp_path / "suite.yaml")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "even the best candidate agrees with only" in text, text
    assert "below 50.0%" in text and "--mean R G B --std R G B" in text


@pytest.mark.e2e
def test_an_unsupported_operation_is_named_with_the_way_out(setup: dict[str, Path]) -> None:
    """A graph with an operation the converter lacks (an identity ``Resize`` of the input, as
    models that resize their input carry): its white-box rows are SKIPPED naming the operation
    and the way out, and the card's limitations say the same."""
    proto = onnx.load(str(setup["dynamic"]))
    graph = proto.graph
    scales = onnx.helper.make_tensor("unit_scales", onnx.TensorProto.FLOAT, [4], [1, 1, 1, 1])
    graph.initializer.append(scales)
    for node in graph.node:
        node.input[:] = ["resized" if i == graph.input[0].name else i for i in node.input]
    graph.node.insert(0, onnx.helper.make_node("Resize", [graph.input[0].name, "", "unit_scales"],
                                               ["resized"], mode="nearest"))
    path = setup["root"] / "resize.onnx"
    onnx.save(proto, str(path))
    proc, m = _run(setup, path, "run-unsupported")
    assert proc.returncode in (0, 1, 7), proc.stderr[-2000:]
    checks = _checks(m)
    assert checks["clean"]["status"] == "PASS"
    apgd = checks["apgd_linf"]
    assert apgd["status"] == "SKIPPED"
    for words in ("does not support: Resize", ".pt2", "other exporter", "dynamo=False"):
        assert words in apgd["decision"], apgd["decision"]
    card = (setup["root"] / "run-unsupported" / "card.html").read_text()
    limits = card[card.index("Limitations"):]
    assert "does not support: Resize" in limits and "model.pt2" in limits


@pytest.mark.unit
def test_a_quantised_network_passes_gradients_straight_through(tmp_path: Path) -> None:
    """A quantise-dequantise pair inside the network (as a QDQ-quantised model has) answers as
    onnxruntime does, and passes the gradient on unchanged (BPDA): the integer tensor ONNX
    defines would stop every gradient, and rounding's own gradient is zero."""
    src = builders.export(builders.make_net(), tmp_path / "float.onnx")
    proto = onnx.load(str(src))
    graph = proto.graph
    conv = next(n for n in graph.node if n.op_type == "Conv")
    for node in graph.node:
        node.input[:] = ["dq" if i == conv.output[0] else i for i in node.input]
    graph.initializer.extend([onnx.numpy_helper.from_array(np.array(0.05, np.float32), "qs"),
                              onnx.numpy_helper.from_array(np.array(128, np.uint8), "qz")])
    at = list(graph.node).index(conv) + 1
    graph.node.insert(at, onnx.helper.make_node("QuantizeLinear", [conv.output[0], "qs", "qz"],
                                                ["q"]))
    graph.node.insert(at + 1, onnx.helper.make_node("DequantizeLinear", ["q", "qs", "qz"],
                                                    ["dq"]))
    path = tmp_path / "qdq.onnx"
    onnx.save(proto, str(path))
    model = load_model(str(path), choose_device("cpu"))
    copy = model.torch_copy()  # type: ignore[attr-defined]
    x = torch.rand(4, 3, 32, 32)
    same = torchcopy.equivalence(copy.scores(x), model.predict(x), copy.quantised)
    assert same.ok, same.why()
    _, _, _, grad = copy.value_and_grad(x, lambda z: z[:, 0] - z[:, 1])
    assert torch.isfinite(grad).all() and bool((grad.flatten(1).abs().amax(1) > 0).all())
    model.close()


class _Rounded(nn.Module):
    """An input-quantising defence: the image rounded to 16 levels before the network."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(torch.round(x * 15) / 15)


class _Masked(nn.Module):
    """A network whose input is multiplied by zero on the way: no gradient signal at all."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x * 0.0 + 0.5)


@pytest.mark.unit
def test_a_rounding_inside_the_network_passes_gradients_straight_through(tmp_path: Path) -> None:
    """Round inside the network (an input-quantising defence) would zero every gradient and
    read as robustness: the copy answers as onnxruntime does, with the identity's gradient
    there (BPDA), i.e. the network's gradient at the rounded image."""
    net = builders.make_net()
    model = load_model(str(_export(_Rounded(net), tmp_path / "r.onnx", dynamo=False,
                                   dynamic=True)), choose_device("cpu"))
    copy = model.torch_copy()  # type: ignore[attr-defined]
    x = torch.rand(4, 3, 32, 32)
    same = torchcopy.equivalence(copy.scores(x), model.predict(x), copy.quantised)
    assert same.ok, same.why()
    _, _, _, grad = copy.value_and_grad(x, lambda z: z[:, 0] - z[:, 1])
    xr = (torch.round(x * 15) / 15).requires_grad_(True)
    (want,) = torch.autograd.grad((lambda z: z[:, 0] - z[:, 1])(net(xr)).sum(), xr)
    assert torch.allclose(grad, want, atol=1e-6)
    model.close()


@pytest.mark.unit
def test_a_network_that_masks_every_gradient_gets_no_white_box(tmp_path: Path) -> None:
    """A copy whose input gradient is zero on every image tried is refused before the first
    check (its attacks would find nothing and prove nothing), with the reason."""
    from certify.engine.plan import try_white_box
    model = load_model(str(_export(_Masked(builders.make_net()), tmp_path / "m.onnx",
                                   dynamo=False, dynamic=True)), choose_device("cpu"))
    why = try_white_box(model, torch.rand(8, 3, 32, 32), torch.arange(8))
    assert why is not None and "zero on all 8 images" in why
    with pytest.raises(torchcopy.WhiteBoxUnavailable, match="zero on all"):
        model.torch_copy()  # type: ignore[attr-defined]
    model.close()


@pytest.mark.unit
def test_a_constant_the_converter_cannot_read_refuses_the_copy_with_the_reason(
        tmp_path: Path) -> None:
    """A Constant node in a form the converter does not read (a sparse tensor) refuses the
    copy as a white-box reason, naming the node, when the copy is built (not an exception of
    another kind from deep inside)."""
    src = builders.export(builders.make_net(), tmp_path / "float.onnx")
    proto = onnx.load(str(src))
    values = onnx.helper.make_tensor("v", onnx.TensorProto.FLOAT, [1], [1.0])
    where = onnx.helper.make_tensor("i", onnx.TensorProto.INT64, [1], [0])
    sparse = onnx.helper.make_sparse_tensor(values, where, [3])
    proto.graph.node.insert(0, onnx.helper.make_node("Constant", [], ["unused"],
                                                     sparse_value=sparse))
    path = tmp_path / "sparse.onnx"
    onnx.save(proto, str(path))
    model = load_model(str(path), choose_device("cpu"))
    with pytest.raises(torchcopy.WhiteBoxUnavailable, match=r"\(Constant\).*\.pt2"):
        model.torch_copy()  # type: ignore[attr-defined]
    model.close()
