"""The IBP-trained demo fixture ``certify/demo/certified.onnx`` (issue 64).

Its figures are recorded by ``benchmarks/train_certified.py`` in ``certify/demo/figures.json``;
here they are re-measured on the demo's test set, the certified one by interval bound
propagation written below in plain torch over the ONNX file's own weights, independent of any
bound code in certify.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from onnx import numpy_helper

from certify.api import DEMO_PER_CLASS, DEMO_SEED
from certify.demo.synthetic import generate

pytestmark = pytest.mark.unit

DEMO = Path(__file__).resolve().parents[1] / "certify" / "demo"
PATH = DEMO / "certified.onnx"
FIGURES = json.loads((DEMO / "figures.json").read_text())["models"]["certified"]
MARGIN = 0.01  # about 4 of the 430 signs


@pytest.fixture(scope="module")
def demo_test_set() -> tuple[np.ndarray, np.ndarray]:
    x, y = generate(DEMO_PER_CLASS, seed=DEMO_SEED)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2), dtype=np.float32) / 255.0, y


def ibp_certified(path: Path, x: np.ndarray, y: np.ndarray, eps: float) -> np.ndarray:
    """Per sign: IBP proves ``z_y − z_j > 0`` for every ``j ≠ y`` over the L∞ ε-box ∩ [0, 1].

    Intervals in centre/radius form through Conv, Relu, Flatten and Gemm; the graph's final Gemm
    is folded into the margins ``z_y − z_j`` (Gowal et al. 2018), as the training script does.
    """
    model = onnx.load(str(path))
    weights = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy())
               for t in model.graph.initializer}
    xt = torch.from_numpy(x).double()
    box = {model.graph.input[0].name: ((xt - eps).clamp(0, 1), (xt + eps).clamp(0, 1))}
    out_name = model.graph.output[0].name
    yt = torch.from_numpy(y)
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        lo, hi = box[node.input[0]]
        c, r = (hi + lo) / 2, (hi - lo) / 2
        if node.op_type == "Conv":
            assert attrs.get("group", 1) == 1 and set(attrs.get("dilations", [1])) == {1}
            w = weights[node.input[1]].double()
            b = weights[node.input[2]].double() if len(node.input) > 2 else None
            pads = attrs.get("pads", [0, 0, 0, 0])
            assert pads[:2] == pads[2:]
            kw = {"stride": tuple(attrs.get("strides", [1, 1])), "padding": tuple(pads[:2])}
            c, r = F.conv2d(c, w, b, **kw), F.conv2d(r, w.abs(), None, **kw)
        elif node.op_type == "Gemm":
            assert attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0
            assert not attrs.get("transA", 0)
            w = weights[node.input[1]].double()
            w = w if attrs.get("transB", 0) else w.T  # [out, in]
            b = weights[node.input[2]].double()
            if node.output[0] == out_name:  # margins z_y − z_j: rows w_y − w_j
                cw = w[yt].unsqueeze(1) - w.unsqueeze(0)
                cb = b[yt].unsqueeze(1) - b.unsqueeze(0)
                lower = (torch.einsum("nkh,nh->nk", cw, c) + cb
                         - torch.einsum("nkh,nh->nk", cw.abs(), r))
                lower[torch.arange(len(yt)), yt] = torch.inf
                return (lower.min(1).values > 0).numpy()
            c, r = F.linear(c, w, b), F.linear(r, w.abs())
        elif node.op_type == "Relu":
            box[node.output[0]] = (F.relu(lo), F.relu(hi))
            continue
        elif node.op_type == "Flatten":
            assert attrs.get("axis", 1) == 1
            c, r = c.flatten(1), r.flatten(1)
        else:
            raise AssertionError(f"no IBP rule for {node.op_type}")
        box[node.output[0]] = (c - r, c + r)
    raise AssertionError("the graph does not end in a Gemm")


def test_fixture_is_small_and_loads_with_43_outputs(demo_test_set):
    assert PATH.stat().st_size < 1024 * 1024
    sess = ort.InferenceSession(str(PATH), providers=["CPUExecutionProvider"])
    (inp,) = sess.get_inputs()
    assert inp.name == "input" and inp.shape[1:] == [3, 32, 32]
    x, _ = demo_test_set
    assert sess.run(None, {"input": x[:5]})[0].shape == (5, 43)
    ops = {n.op_type for n in onnx.load(str(PATH)).graph.node}
    assert ops <= {"Conv", "Relu", "Flatten", "Gemm", "MatMul", "Add", "Reshape"}


def test_clean_accuracy_matches_its_record(demo_test_set):
    x, y = demo_test_set
    sess = ort.InferenceSession(str(PATH), providers=["CPUExecutionProvider"])
    acc = float((sess.run(None, {"input": x})[0].argmax(1) == y).mean())
    assert acc >= FIGURES["clean_accuracy"] - MARGIN


def test_ibp_certifies_its_recorded_share_at_2_255(demo_test_set):
    x, y = demo_test_set
    cert2 = ibp_certified(PATH, x, y, 2 / 255)
    assert cert2.mean() >= FIGURES["ibp_certified"]["2/255"] - MARGIN
    assert cert2.mean() >= 0.3  # the goal
    # certified signs are classified correctly, and the box is monotone in ε
    sess = ort.InferenceSession(str(PATH), providers=["CPUExecutionProvider"])
    pred = sess.run(None, {"input": x})[0].argmax(1)
    assert (pred[cert2] == y[cert2]).all()
    cert1 = ibp_certified(PATH, x, y, 1 / 255)
    assert (cert1 | ~cert2).all() and cert1.mean() > cert2.mean()
    assert FIGURES["pgd"]["robust_accuracy"] >= FIGURES["ibp_certified"]["2/255"]
