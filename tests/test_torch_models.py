"""PyTorch programs as models (.pt2, TorchScript), the files certify refuses to load, and the
model-loader registry.

The demo's standard model, rebuilt as a torch module from its ONNX weights, is saved with
``torch.export`` and with TorchScript: both must give the ONNX file's figures, and their
white-box rows must run on the program's own gradients (certify's torch copy of an ONNX graph
is never built). Every refused file carries a payload that writes a marker file: the marker
must not appear.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from certify.api import DEMO_PER_CLASS, DEMO_SEED, demo_model_path
from certify.device import choose_device
from certify.errors import ModelError
from certify.models import load_model, registry
from certify.models.onnx import sha256_file

import builders

SUITE_CHECKS = {"clean": {}, "rotation": {},
                "apgd_linf": {"samples": 8, "params": {"attack": "apgd_ce", "norm": "linf",
                                                      "epsilon": 0.0314, "eps_sweep": False}}}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The demo model as ONNX, .pt2 and TorchScript, a reduced suite and 3 signs a class."""
    from certify.demo.synthetic import generate
    from certify.suite import resolve_suite_path

    root = tmp_path_factory.mktemp("programs")
    module = builders.demo_module()
    pt2, ts = builders.save_programs(module, root / "models")
    traced = root / "models" / "traced.pt"  # how most TorchScript files are made (issue 49)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.trace(module, torch.rand(1, 3, 32, 32)), str(traced))
    x, y = generate(DEMO_PER_CLASS, seed=DEMO_SEED)
    keep = np.concatenate([np.flatnonzero(y == k)[:3] for k in range(43)])
    np.savez(root / "signs.npz", x=x[keep], y=y[keep])
    raw = yaml.safe_load(resolve_suite_path("gtsrb").read_text())
    raw["checks"] = [{**c, **SUITE_CHECKS[c["id"]]} for c in raw["checks"]
                     if c["id"] in SUITE_CHECKS]
    (root / "suite.yaml").write_text(yaml.safe_dump(raw))
    return {"onnx": demo_model_path("standard"), "pt2": pt2, "ts": ts, "traced": traced,
            "root": root}


def _run(programs: dict[str, Path], which: str, *extra: str) -> dict:
    out = programs["root"] / f"run-{which}"
    proc = builders.run_cli("run", programs[which], "--suite", programs["root"] / "suite.yaml",
                            "--data", programs["root"] / "signs.npz", "--no-pdf",
                            "--out", out, *extra)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # 1: a check failed
    return json.loads((out / "results.json").read_text())


@pytest.mark.e2e
def test_programs_give_the_onnx_files_figures_on_their_own_gradients(
        programs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    onnx_run = _run(programs, "onnx")

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("certify built a torch copy of an ONNX graph for a program")

    monkeypatch.setattr("certify.models.torchcopy.TorchCopy.__init__", never)
    runs = {"pt2": _run(programs, "pt2"),
            **{ts: _run(programs, ts, "--input-size", "32", "32") for ts in ("ts", "traced")}}
    want = {c["id"]: c for c in onnx_run["measurement"]["checks"]}
    for which, run in runs.items():
        model = run["measurement"]["model"]
        assert model["white_box"] == "available"
        assert model["identity"] == "sha256:" + sha256_file(programs[which])
        for c in run["measurement"]["checks"]:
            ref = want[c["id"]]
            assert c["status"] == ref["status"], (which, c["id"])
            # the same decisions on every sample (only float rounding could move one: the
            # figures must then stay inside the ONNX row's interval)
            if c["outcomes"] != ref["outcomes"]:
                for name, (lo, hi) in ref["intervals"].items():
                    assert lo <= c["metrics"][name] <= hi, (which, c["id"], name)
            else:
                assert c["metrics"] == ref["metrics"], (which, c["id"])
        apgd = next(c for c in run["measurement"]["checks"] if c["id"] == "apgd_linf")
        assert apgd["metrics"]["gradient_evaluations"] > 0


class _Rounded(nn.Module):
    """A classifier whose scores are rounded to quarters: no gradient through the head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(),
                                  nn.Linear(4 * 30 * 30, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.round(self.body(x) * 4) / 4


def _saved_and_loaded(net: nn.Module, folder: Path, kind: str) -> tuple[Any, Any]:
    """``net`` saved as ``kind`` (pt2 or ts), loaded, and its white-box view."""
    pt2, ts = builders.save_programs(net, folder)
    model = load_model(str(pt2 if kind == "pt2" else ts), choose_device("cpu"),
                       input_size=(32, 32))
    return model, model.torch_copy()  # type: ignore[attr-defined]


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["pt2", "ts"])
def test_a_rounding_head_keeps_its_gradient_cut(tmp_path: Path, kind: str) -> None:
    net = _Rounded().eval()
    model, grads = _saved_and_loaded(net, tmp_path, kind)
    assert grads.head[-2:] == ("round", "div") and grads.quantised
    x = torch.rand(6, 3, 32, 32)
    scores, cut, value, grad = grads.value_and_grad(x, lambda z: z[:, 1] - z[:, 0])
    xr = x.clone().requires_grad_(True)
    logits = net.body(xr)
    (want,) = torch.autograd.grad((logits[:, 1] - logits[:, 0]).sum(), xr)
    assert torch.allclose(cut, logits.detach(), atol=1e-5)
    assert torch.allclose(grad, want, atol=1e-6) and grad.abs().sum() > 0  # BPDA at the cut
    assert torch.equal(scores, net(x).detach()) and torch.equal(scores, model.predict(x))
    assert torch.equal(grads.apply_head(torch.tensor([[0.3, 1.1]])), torch.tensor([[0.25, 1.0]]))
    model.close()


class _Payload:
    """Unpickling it creates the folder ``path`` (what a malicious file would do worse)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.mkdir, (self.path,)


class _WritesFile(nn.Module):
    """A classifier that maps ``path`` into memory, shared, whenever it runs: it creates (or
    overwrites) that file."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.from_file(self.path, True, 16)
        return self.fc(x.mean((2, 3))) + t.sum() * 0


def _refused(path: Path, marker: Path, *extra: str) -> str:
    proc = builders.run_cli("run", path, "--suite", "gtsrb", "--data", path, "--no-pdf",
                            "--out", path.parent / "never", *extra)
    assert proc.returncode == 3, proc.stderr
    assert not marker.exists(), "the payload ran"
    assert not (path.parent / "never").exists()
    return proc.stderr


def _rewrite(src: Path, dst: Path, replace: dict[str, bytes]) -> None:
    """A copy of the zip ``src`` with members (names after the top folder) replaced."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            rel = info.filename.split("/", 1)[1]
            zout.writestr(info.filename, replace.get(rel, zin.read(info)))


@pytest.mark.e2e
def test_pickles_and_armed_archives_are_refused_without_running(tmp_path: Path) -> None:
    net = _Rounded().eval()
    pt2, ts = builders.save_programs(net, tmp_path / "ok")
    marker = tmp_path / "ran"

    state = tmp_path / "weights.pt"
    torch.save(net.state_dict(), state)
    err = _refused(state, marker)
    assert "pickle" in err and "torch.export.save" in err

    armed = tmp_path / "armed.pkl"
    armed.write_bytes(pickle.dumps(_Payload(marker)))
    assert "never unpickles" in _refused(armed, marker)

    # a .pt2 whose sample inputs are a pickle with a payload: torch.export.load runs it ...
    sample_armed = tmp_path / "sample.pt2"
    _rewrite(pt2, sample_armed, {"data/sample_inputs/model.pt": pickle.dumps(_Payload(marker))})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception):  # noqa: B017, PT011 - whatever it raises after the payload
            torch.export.load(str(sample_armed))
    assert marker.exists(), "the planted payload is live"
    marker.rmdir()
    # ... and certify refuses the archive before torch reads it
    assert "sample_inputs" in _refused(sample_armed, marker)

    # any other pickled member: a weight declared pickled
    with zipfile.ZipFile(pt2) as z:
        top = z.namelist()[0].split("/", 1)[0]
        config = json.loads(z.read(f"{top}/data/weights/model_weights_config.json"))
    first = next(iter(config["config"].values()))
    first["use_pickle"] = True
    weight_armed = tmp_path / "weight.pt2"
    _rewrite(pt2, weight_armed, {
        "data/weights/model_weights_config.json": json.dumps(config).encode(),
        f"data/weights/{first['path_name']}": pickle.dumps(_Payload(marker))})
    assert "weights-only" in _refused(weight_armed, marker)

    # a TorchScript program that writes a file through torch.from_file when it runs
    writes = tmp_path / "writes.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(_WritesFile(str(marker))), str(writes))
    assert "from_file" in _refused(writes, marker, "--input-size", "32", "32")
    # the unchanged programs load
    for good in (pt2, ts):
        load_model(str(good), choose_device("cpu"), input_size=(32, 32)).close()


@pytest.mark.e2e
def test_an_unknown_file_names_the_formats_certify_reads(tmp_path: Path) -> None:
    junk = tmp_path / "model.bin"
    junk.write_bytes(b"\x00garbage" * 10)
    proc = builders.run_cli("run", junk, "--suite", "gtsrb", "--no-pdf", "--out",
                            tmp_path / "out")
    assert proc.returncode == 3
    for title in ("ONNX", ".pt2", "TorchScript", "http"):
        assert title in proc.stderr
    assert not registry.is_endpoint(str(junk)) and registry.is_endpoint("https://x.test/m")
    assert registry.identify(str(demo_model_path("standard"))).uploadable
    with pytest.raises(ModelError, match="directory"):
        registry.identify(str(tmp_path))


@pytest.mark.unit
def test_the_service_takes_onnx_uploads_only(tmp_path: Path) -> None:
    from certify.service.uploads import Limits, UploadError, prepare_model

    pt2, ts = builders.save_programs(_Rounded().eval(), tmp_path / "p")
    for program in (pt2, ts):
        with pytest.raises(UploadError, match=re.escape("takes ONNX models only")):
            prepare_model([(program.name, program)], tmp_path / f"up-{program.suffix[1:]}",
                          Limits())


class _Scaled(nn.Module):
    """Batch norm (a 0-dim buffer) and a plain tensor attribute of a submodule (a constant)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(),
                                  nn.Linear(4 * 30 * 30, 5))
        self.body[3].scale = torch.ones(5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * self.body[3].scale


@pytest.mark.unit
def test_program_digest_names_graph_weights_and_nested_constants() -> None:
    from certify.models.torchprog import program_digest

    net = _Scaled().eval()
    x = torch.rand(1, 3, 32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = program_digest(torch.export.export(net, (x,)))
        b = program_digest(torch.export.export(net, (x,)))
        net.body[3].scale[0] = 2.0  # only a constant of a submodule changes
        c = program_digest(torch.export.export(net, (x,)))
        net.body[3].bias.data[0] += 1e-3
        d = program_digest(torch.export.export(net, (x,)))
    assert a == b and len({a, c, d}) == 3 and a.startswith("sha256:")


class _BatchOfOne(nn.Module):
    """A classifier whose graph fixes the batch at one (a reshape to ``[1, -1]``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.fc = nn.Linear(3 * 32 * 32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.reshape(1, -1))


@pytest.mark.unit
def test_a_program_that_fixes_its_batch_is_fed_one_image_at_a_time(tmp_path: Path) -> None:
    net = _BatchOfOne().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.export.save(torch.export.export(net, (torch.rand(1, 3, 32, 32),)),
                          str(tmp_path / "one.pt2"))
    model = load_model(str(tmp_path / "one.pt2"), choose_device("cpu"))
    assert model.info.batch == "fixed 1 (chunked)"
    x = torch.rand(5, 3, 32, 32)
    want = torch.cat([net(x[i:i + 1]) for i in range(5)]).detach()
    assert torch.allclose(model.predict(x), want, atol=1e-6)
    scores, _, _, grad = model.torch_copy().value_and_grad(  # type: ignore[attr-defined]
        x, lambda z: z[:, 0])
    assert torch.allclose(scores, want, atol=1e-6) and grad.shape == x.shape
    assert torch.allclose(grad[2], net.fc.weight[0].reshape(3, 32, 32), atol=1e-6)
    # a loss with one target per row (APGD's) sees the whole batch, not one chunk
    y = torch.tensor([0, 1, 2, 3, 0])
    _, _, value, grad = model.torch_copy().value_and_grad(  # type: ignore[attr-defined]
        x, lambda z: nn.functional.cross_entropy(z, y, reduction="none"))
    assert torch.allclose(value, nn.functional.cross_entropy(want, y, reduction="none"),
                          atol=1e-5) and grad.abs().sum() > 0


@pytest.mark.e2e
def test_init_probes_a_torchscript_program(programs: dict[str, Path]) -> None:
    """A TorchScript file states no input size: init takes the data's and probes the program
    like an ONNX file (its preprocessing views share the loaded program)."""
    out = programs["root"] / "init-suite.yaml"
    proc = builders.run_cli("init", programs["ts"], "--data", programs["root"] / "signs.npz",
                            "--out", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "the data's images: the model does not state it" in proc.stdout + proc.stderr
    suite = yaml.safe_load(out.read_text())
    assert suite["preprocessing"]["input_size"] == [32, 32]
    assert suite["preprocessing"].get("input_scale", 1) == 1



class _TwoHeads(nn.Module):
    """Scores first, an embedding second, and a final matmul with a transposed weight."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 8), nn.ReLU())
        self.w = nn.Parameter(torch.randn(5, 8))
        self.proj = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.body(x)
        return torch.round(f @ self.w.T), self.proj(f)


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["pt2", "ts"])
def test_the_cut_is_the_layer_that_feeds_the_answer(tmp_path: Path, kind: str) -> None:
    net = _TwoHeads().eval()
    model, grads = _saved_and_loaded(net, tmp_path, kind)
    assert grads.head == ("round",)
    x = torch.rand(3, 3, 32, 32)
    _, cut, _, _ = grads.value_and_grad(x, lambda z: z.sum(1))
    assert torch.allclose(cut, (net.body(x) @ net.w.T).detach(), atol=1e-5)


class _RoundedLast(nn.Module):
    """The demo's network with its scores rounded to quarters (a head the binarization test
    keeps after its readout), its last layer as ``linear`` or written ``x @ W.T + b``."""

    def __init__(self, seq: nn.Sequential, matmul: bool) -> None:
        super().__init__()
        self.body, self.last, self.matmul = seq[:-1], seq[-1], matmul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.body(x)
        out = f @ self.last.weight.T + self.last.bias if self.matmul else self.last(f)
        return torch.round(out * 4) / 4


@pytest.mark.e2e
def test_a_matmul_and_bias_last_layer_gives_the_linear_programs_card(
        programs: dict[str, Path]) -> None:
    """The cut moves over the bias add (issue 49): the head is the rounding alone, which
    Square's binarization test keeps after its 2-class readout, and the card equals the one of
    the same weights in ``linear``."""
    from certify.suite import resolve_suite_path

    root = programs["root"]
    raw = yaml.safe_load(resolve_suite_path("gtsrb").read_text())
    small = {"clean": {}, "apgd_linf": SUITE_CHECKS["apgd_linf"],
             "square_linf": builders.DEMO_SMALL["square_linf"]}
    raw["checks"] = [{**c, **{k: v for k, v in small[c["id"]].items() if k != "params"},
                      "params": {**c.get("params", {}), **small[c["id"]].get("params", {})}}
                     for c in raw["checks"] if c["id"] in small]
    (root / "matmul-suite.yaml").write_text(yaml.safe_dump(raw))
    seq = builders.demo_module()
    runs = {}
    for name in ("linear", "matmul"):
        pt2, _ = builders.save_programs(_RoundedLast(seq, name == "matmul").eval(), root / name)
        model = load_model(str(pt2), choose_device("cpu"))
        assert model.torch_copy().head == ("mul", "round", "div"), name  # type: ignore
        model.close()
        out = root / f"run-{name}"
        proc = builders.run_cli("run", pt2, "--suite", root / "matmul-suite.yaml", "--data",
                                root / "signs.npz", "--no-pdf", "--out", out)
        assert proc.returncode in (0, 1, 6, 7), proc.stderr[-2000:]
        runs[name] = json.loads((out / "results.json").read_text())["measurement"]
    assert runs["matmul"]["model"]["white_box"] == "available"
    want = {c["id"]: c for c in runs["linear"]["checks"]}
    for c in runs["matmul"]["checks"]:
        assert c["status"] == want[c["id"]]["status"] not in ("ERROR", "SKIPPED"), c["id"]
        assert c["metrics"] == want[c["id"]]["metrics"], c["id"]
        assert c["outcomes"] == want[c["id"]]["outcomes"], c["id"]


class _Conv1x1Head(nn.Module):
    """Features pooled to 1×1, a 1×1 convolution to 5 classes, flattened and rounded."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.body = nn.Sequential(nn.Conv2d(3, 6, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.classify = nn.Conv2d(6, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.round(self.classify(self.body(x)).flatten(1) * 4) / 4


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["pt2", "ts"])
def test_a_1x1_convolution_is_the_last_linear_layer(tmp_path: Path, kind: str) -> None:
    net = _Conv1x1Head().eval()
    model, grads = _saved_and_loaded(net, tmp_path, kind)
    assert grads.head == ("flatten", "mul", "round", "div")
    x = torch.rand(3, 3, 32, 32)
    _, cut, _, grad = grads.value_and_grad(x, lambda z: z[:, 1] - z[:, 0])
    assert torch.allclose(cut, net.classify(net.body(x)).flatten(1).detach(), atol=1e-5)
    assert grad.abs().sum() > 0  # BPDA: the rounding is after the cut
    # the binarization test's 2-class readout runs through the head (flatten of [N, 2, 1, 1])
    assert torch.equal(grads.apply_head(torch.tensor([[0.3, 1.1]])), torch.tensor([[0.25, 1.0]]))
    model.close()


@pytest.mark.unit
@pytest.mark.parametrize("how", ["trace", "script", "freeze", "dynamic_pt2"])
def test_programs_saved_the_ways_teams_save_them_load(tmp_path: Path, how: str) -> None:
    net = builders.make_net(seed=2)
    x = torch.rand(1, 3, 32, 32)
    path = tmp_path / ("m.pt2" if how == "dynamic_pt2" else "m.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "dynamic_pt2":
            torch.export.save(torch.export.export(
                net, (torch.rand(2, 3, 32, 32),),
                dynamic_shapes=({0: torch.export.Dim("batch")},)), str(path))
        else:
            saved = {"trace": lambda: torch.jit.trace(net, x),
                     "script": lambda: torch.jit.script(net),
                     "freeze": lambda: torch.jit.freeze(torch.jit.script(net))}[how]()
            torch.jit.save(saved, str(path))
    model = load_model(str(path), choose_device("cpu"), input_size=(32, 32))
    assert model.info.batch == "dynamic" and model.info.white_box == "available"
    xs = torch.rand(5, 3, 32, 32)
    assert torch.allclose(model.predict(xs), net(xs).detach(), atol=1e-5)
    _, _, _, grad = model.torch_copy().value_and_grad(  # type: ignore[attr-defined]
        xs, lambda z: z[:, 0])
    xr = xs.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(net(xr)[:, 0].sum(), xr)
    assert torch.allclose(grad, want, atol=1e-5)
    model.close()


@pytest.mark.unit
def test_optimize_for_inference_is_black_box_in_memory_and_said_on_file(
        tmp_path: Path) -> None:
    from certify.models.torchprog import from_module

    net = builders.make_net(seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = torch.jit.optimize_for_inference(torch.jit.script(net))
        torch.jit.save(fast, str(tmp_path / "fast.pt"))
    model = from_module(fast, choose_device("cpu"), None, (32, 32), None)
    assert model.info.identity.startswith("sha256:")
    assert "optimize_for_inference" in model.info.white_box  # MKLDNN kernels: no gradient
    xs = torch.rand(4, 3, 32, 32)
    assert torch.allclose(model.predict(xs), net(xs).detach(), atol=1e-4)
    with pytest.raises(ModelError) as refused:
        load_model(str(tmp_path / "fast.pt"), choose_device("cpu"), input_size=(32, 32))
    assert "torch.jit.freeze" in refused.value.hint


def _armed_pt2(src: Path, dst: Path, marker: Path, how: str) -> Path:
    """A copy of the archive ``src`` armed to create ``marker`` when torch loads or runs it."""
    with zipfile.ZipFile(src) as z:
        top = z.namelist()[0].split("/", 1)[0]
        members = {i.filename.split("/", 1)[1]: z.read(i) for i in z.infolist()}
    payload = pickle.dumps(_Payload(marker))
    entries = list(members.items())
    if how == "duplicate":  # torch finds the first copy, a dict keeps the last
        entries.insert(0, ("data/sample_inputs/model.pt", payload))
    elif how == "case":  # a raw member and a pickled one whose names differ in case only
        config = json.loads(members["data/weights/model_weights_config.json"])
        meta = json.loads(json.dumps(next(iter(config["config"].values()))["tensor_meta"]))
        meta.update(dtype=1, sizes=[{"as_int": len(payload)}], strides=[{"as_int": 1}])
        config["config"]["raw"] = {"path_name": "EVIL", "is_param": False,
                                   "use_pickle": False, "tensor_meta": meta}
        config["config"]["pickled"] = {"path_name": "evil", "is_param": False,
                                       "use_pickle": True, "tensor_meta": None}
        entries = [(k, json.dumps(config).encode() if k.endswith("weights_config.json")
                    else v) for k, v in entries] + [("data/weights/EVIL", payload)]
    elif how in ("expr", "from_file"):
        doc = json.loads(members["models/model.json"])
        graph = doc["graph_module"]["graph"]
        if how == "expr":  # torch parses shape expressions with sympify, which evaluates
            graph["tensor_values"]["x"]["sizes"][0] = {"as_expr": {
                "expr_str": f"__import__('os').mkdir('{marker}')", "hint": {"as_int": 1}}}
        else:  # the graph itself maps a file into memory
            graph["nodes"].insert(0, {"target": "torch.ops.aten.from_file.default", "inputs": [
                {"name": "filename", "arg": {"as_string": str(marker)}, "kind": 1},
                {"name": "shared", "arg": {"as_bool": True}, "kind": 1},
                {"name": "size", "arg": {"as_int": 16}, "kind": 1}],
                "outputs": [{"as_tensor": {"name": "ff"}}], "metadata": {}})
        entries = [(k, json.dumps(doc).encode() if k == "models/model.json" else v)
                   for k, v in entries]
    with zipfile.ZipFile(dst, "w") as z, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the duplicate member is the point
        for name, data in entries:
            z.writestr(f"{top}/{name}", data)
    if how == "prepended":  # Python's zip reader allows bytes in front, torch's does not
        dst.write_bytes(b"\0" * 64 + dst.read_bytes())
    return dst


@pytest.mark.unit
@pytest.mark.parametrize("how", ["duplicate", "case", "expr", "from_file", "prepended"])
def test_archives_that_fool_a_member_by_member_check_are_refused(tmp_path: Path,
                                                                 how: str) -> None:
    pt2, _ = builders.save_programs(_Rounded().eval(), tmp_path / "ok")
    marker = tmp_path / "ran"
    armed = _armed_pt2(pt2, tmp_path / f"{how}.pt2", marker, how)
    if how == "expr":  # the planted expression is live: torch.export.load evaluates it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(Exception):  # noqa: B017, PT011 - whatever follows the payload
                torch.export.load(str(armed))
        assert marker.exists()
        marker.rmdir()
    # a prepended archive is no zip to certify's recognition: refused as no format it reads
    with pytest.raises(ModelError, match="is refused|not a model format certify reads"):
        load_model(str(armed), choose_device("cpu"), input_size=(32, 32))
    assert not marker.exists()


@pytest.mark.unit
@pytest.mark.parametrize("spelling", ["torch . from_file(", "(torch).from_file(",
                                      'getattr(torch, "from_file")(', "ops.aten.from_file("])
def test_torchscript_file_operations_are_refused_however_spelled(tmp_path: Path,
                                                                 spelling: str) -> None:
    marker = tmp_path / "ran"
    plain = tmp_path / "plain.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(_WritesFile(str(marker))), str(plain))
    with zipfile.ZipFile(plain) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    code = next(k for k, v in members.items() if "/code/" in k and k.endswith(".py")
                and b"from_file" in v)
    assert b"torch.from_file(" in members[code]
    members[code] = members[code].replace(b"torch.from_file(", spelling.encode())
    armed = tmp_path / "armed.pt"
    with zipfile.ZipFile(armed, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    with pytest.raises(ModelError, match="is refused"):
        load_model(str(armed), choose_device("cpu"), input_size=(32, 32))
    assert not marker.exists()


class _Bucketed(nn.Module):
    """A classifier with no linear layer whose answer is quantised: no gradient anywhere."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.round(x.mean((2, 3)) * 4)


@pytest.mark.unit
def test_a_program_without_gradients_gets_black_box_attacks_only(tmp_path: Path) -> None:
    pt2, _ = builders.save_programs(_Bucketed().eval(), tmp_path)
    model = load_model(str(pt2), choose_device("cpu"))
    assert model.info.white_box.startswith("unavailable: its gradient is zero")
