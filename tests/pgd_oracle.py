"""An independent white-box yardstick for certify's attacks (issue 27), shared by the tests
and ``benchmarks/ensemble.py``: a plain-torch PGD on an ``nn.Sequential`` rebuilt from the ONNX
file's weights (not certify's converter), 100 steps with step ε/4 decaying linearly (L2: ε/2.5
on the normalised gradient), a zero and a random start, margin and cross-entropy losses, every
candidate judged by onnxruntime on the real model; and :func:`with_head`, the acceptance's
output heads (rounded logits, rounded softmax, rescaled logits, labels) planted on a model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn


class Judge:
    """The real model: onnxruntime on the ONNX file (scores ``[N, K]``, one-hot for labels)."""

    def __init__(self, path: Path) -> None:
        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        out = self.session.run(None, {"input": x.detach().numpy().astype(np.float32)})[0]
        if out.ndim == 1:
            return torch.nn.functional.one_hot(torch.from_numpy(out).long(), 43).float()
        return torch.from_numpy(out)


def oracle_net(path: Path) -> nn.Sequential:
    """The demo architecture rebuilt from the ONNX file's weights with torch.nn layers (the
    oracle's own route to gradients; the demo graphs are Conv/Relu/MaxPool/Flatten/Gemm)."""
    m = onnx.load(str(path))
    w = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in m.graph.initializer}
    layers: list[nn.Module] = []
    for node in m.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Conv":
            weight = w[node.input[1]]
            conv = nn.Conv2d(weight.shape[1], weight.shape[0], weight.shape[2],
                             stride=attrs.get("strides", [1])[0],
                             padding=attrs.get("pads", [0])[0])
            conv.weight.data, conv.bias.data = weight, w[node.input[2]]
            layers.append(conv)
        elif node.op_type == "Relu":
            layers.append(nn.ReLU())
        elif node.op_type == "MaxPool":
            layers.append(nn.MaxPool2d(attrs["kernel_shape"][0], attrs["strides"][0]))
        elif node.op_type == "Flatten":
            layers.append(nn.Flatten())
        elif node.op_type == "Gemm":
            weight = w[node.input[1]]
            lin = nn.Linear(weight.shape[1], weight.shape[0])
            lin.weight.data, lin.bias.data = weight, w[node.input[2]]
            layers.append(lin)
        else:
            raise AssertionError(f"the oracle does not rebuild {node.op_type}")
    return nn.Sequential(*layers).eval()


def oracle_candidates(net: nn.Module, x: torch.Tensor, y: torch.Tensor, norm: str,
                      eps: float, steps: int = 100) -> list[torch.Tensor]:
    """The yardstick PGD's final point of each run (a zero and a random start, each with the
    margin and the cross-entropy loss), for the real model to judge."""
    out = []
    gen = torch.Generator().manual_seed(0)
    for start in ("zero", "random"):
        for loss_name in ("margin", "ce"):
            if start == "zero":
                d = torch.zeros_like(x)
            elif norm == "linf":
                d = (2 * torch.rand(x.shape, generator=gen) - 1) * eps
            else:
                d = torch.randn(x.shape, generator=gen)
                d = d / d.flatten(1).norm(dim=1).view(-1, 1, 1, 1) * eps / 2
            best_loss = torch.full((len(x),), -float("inf"))
            best = x + d
            for t in range(steps):
                a = (x + d).clamp(0, 1).requires_grad_(True)
                z = net(a)
                if loss_name == "ce":
                    loss = nn.functional.cross_entropy(z, y, reduction="none")
                else:
                    other = z.clone()
                    other.scatter_(1, y.view(-1, 1), -1e9)
                    loss = other.max(1).values - z.gather(1, y.view(-1, 1)).squeeze(1)
                (g,) = torch.autograd.grad(loss.sum(), a)
                with torch.no_grad():
                    better = loss > best_loss  # keep each sample's highest-loss point
                    best[better], best_loss[better] = a[better], loss[better]
                    decay = 1 - t / steps
                    if norm == "linf":
                        d = (d + eps / 4 * decay * g.sign()).clamp(-eps, eps)
                    else:
                        g = g / g.flatten(1).norm(dim=1).clamp(min=1e-12).view(-1, 1, 1, 1)
                        d = d + eps / 2.5 * decay * g
                        n = d.flatten(1).norm(dim=1).clamp(min=1e-12).view(-1, 1, 1, 1)
                        d = d * torch.clamp(eps / n, max=1.0)
                    d = (x + d).clamp(0, 1) - x
            out += [best.detach(), (x + d).detach()]
    return out


def oracle_broken(candidates: list[torch.Tensor], judge: Judge, y: torch.Tensor
                  ) -> torch.Tensor:
    """``[B]`` bool: broken by any of the oracle's candidates, judged on the real model."""
    broken = torch.zeros(len(y), dtype=torch.bool)
    for c in candidates:
        broken |= judge.predict(c).argmax(1) != y
    return broken


def with_head(src: Path, dst: Path, head: str) -> Path:
    """The model at ``src`` with ``head`` appended to its logits: ``round4`` rounds them to
    multiples of 4, ``softmax2`` answers softmax probabilities rounded to 2 decimals,
    ``x0.1``/``x10`` rescale them, ``argmax`` answers labels. No decision changes (up to ties)."""
    m = onnx.load(str(src))
    g = m.graph
    logits = g.output[0].name

    def const(name: str, v: float) -> str:
        g.initializer.append(numpy_helper.from_array(np.array(v, dtype=np.float32), name))
        return name

    chain = {
        "none": [],
        "round4": [("Div", [logits, const("four", 4.0)], "q"), ("Round", ["q"], "r"),
                   ("Mul", ["r", "four"], "scores")],
        "softmax2": [("Softmax", [logits], "p"), ("Mul", ["p", const("hundred", 100.0)], "q"),
                     ("Round", ["q"], "r"), ("Div", ["r", "hundred"], "scores")],
        "x0.1": [("Mul", [logits, const("tenth", 0.1)], "scores")],
        "x10": [("Mul", [logits, const("ten", 10.0)], "scores")],
        "argmax": [("ArgMax", [logits], "scores")],
    }[head]
    for op, inputs, out in chain:
        attrs = {"axis": 1} if op in ("Softmax", "ArgMax") else {}
        if op == "ArgMax":
            attrs["keepdims"] = 0
        g.node.append(helper.make_node(op, inputs, [out], **attrs))
    if chain:
        del g.output[:]
        if head == "argmax":
            g.output.append(helper.make_tensor_value_info("scores", TensorProto.INT64, ["batch"]))
        else:
            g.output.append(helper.make_tensor_value_info("scores", TensorProto.FLOAT,
                                                          ["batch", 43]))
    onnx.save(m, str(dst))
    return dst
