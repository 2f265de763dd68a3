"""The FX front end of the verifier (certify/models/bound_fx.py) against the ONNX one.

One op set, two front ends: the same small networks, exported by ``torch.export`` (in memory,
through a ``.pt2`` file, and decomposed to core aten) and by torch's ONNX exporter, give the same
margins (IBP, CROWN, α-CROWN at L∞ and L2) to 1e-8, with and without the model's preprocessing
as an :class:`InputMap`; the graphs' values are the network's. Also: :meth:`InputMap.pull` is
the transpose of the preprocessing (against autograd), and a final softmax is left out alike.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from certify.models.base import Preprocessing
from certify.models.bound_fx import fx_bound_graph
from certify.models.bound_ops import METHODS, BoundGraph, BoundsUnavailable, InputMap

pytestmark = pytest.mark.unit

torch.set_num_threads(1)
AGREE = 1e-8
NORMS = (("linf", 0.02), ("l2", 0.2))
ALPHA_STEPS = 10


class SmallCNN(nn.Module):
    """conv → BN → ReLU → MaxPool → conv → BN → ReLU → + skip → AvgPool and adaptive pool →
    flatten → linear (3×8×8 in, 3 classes)."""

    def __init__(self, channels: int = 3, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv1 = nn.Conv2d(channels, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 2 * 2 + 4, 3)
        for bn in (self.bn1, self.bn2):
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.2, 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        h = torch.relu(self.bn2(self.conv2(h))) + h
        a = F.avg_pool2d(h, 2).flatten(1)
        g = F.adaptive_avg_pool2d(h, 1).flatten(1)
        return self.fc(torch.cat([a, g], 1))


class MLP(nn.Module):
    def __init__(self, channels: int = 3, seed: int = 1, softmax: bool = False) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(channels * 16, 16), nn.ReLU(),
                                 nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 3))
        self.softmax = softmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.net(x)
        return F.softmax(z, dim=1) if self.softmax else z


class Mixed(nn.Module):
    """The other operators: Sub / Mul / Div by constants, Pad, LeakyRelu, Dropout, Neg,
    Concat, GlobalAveragePool (``mean``: as a mean over H, W with keepdim)."""

    def __init__(self, mean: bool) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.conv = nn.Conv2d(3, 3, 3)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(3 + 2 * 3 * 4 * 4, 3)
        self.mean = mean

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = (x - 0.5) * 2.0 / 0.625
        h = F.pad(h, (1, 1, 1, 1), value=0.25)
        h = F.leaky_relu(self.drop(self.conv(h)), 0.125)
        g = h.mean((2, 3), keepdim=True) if self.mean else F.adaptive_avg_pool2d(h, 1)
        both = torch.cat([h, -h], 1).flatten(1)
        return self.head(torch.cat([g.flatten(1), both], 1))


def onnx_of(net: nn.Module, shape: tuple) -> onnx.ModelProto:
    """torch's ONNX export (TorchScript exporter, as tests/test_bounds.py), BatchNormalization
    kept (PRESERVE: not folded into the convolution in float32)."""
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.rand(1, *shape),), f, input_names=["input"],
                          output_names=["output"], dynamic_axes={"input": {0: "b"},
                                                                 "output": {0: "b"}},
                          dynamo=False, opset_version=17,
                          training=torch.onnx.TrainingMode.PRESERVE)
    return onnx.load_from_string(f.getvalue())


def exported(net: nn.Module, shape: tuple) -> torch.fx.GraphModule:
    """The exported program's graph, as ``ExportedProgram.module()`` gives it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(net, (torch.rand(2, *shape),)).module()


def programs(net: nn.Module, shape: tuple, tmp: Path) -> dict[str, torch.fx.GraphModule]:
    """The exported program's graph: in memory, saved and loaded back, decomposed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(net, (torch.rand(2, *shape),))
        path = tmp / "net.pt2"
        torch.export.save(ep, str(path))
        return {"export": ep.module(), "pt2": torch.export.load(str(path)).module(),
                "core aten": ep.run_decompositions().module()}


def images(shape: tuple, n: int = 4, seed: int = 5) -> torch.Tensor:
    return torch.rand((n, *shape), generator=torch.Generator().manual_seed(seed))


def all_margins(graph: BoundGraph, x: torch.Tensor, y: torch.Tensor
                ) -> dict[tuple[str, str], torch.Tensor]:
    return {(m, norm): v for norm, eps in NORMS
            for m, v in graph.bounds(x, y, norm, eps, methods=METHODS,
                                     alpha_steps=ALPHA_STEPS).margins.items()}


def assert_agree(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=0, atol=AGREE), (what, k, a[k], b[k])


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """Each network with its shape, ONNX graph and exported programs."""
    out = {}
    for name, net, shape in (("cnn", SmallCNN(), (3, 8, 8)), ("mlp", MLP(), (3, 4, 4))):
        net.eval()
        out[name] = (net, shape, onnx_of(net, shape),
                     programs(net, shape, tmp_path_factory.mktemp(name)))
    return out


@pytest.mark.parametrize("name", ["cnn", "mlp"])
def test_both_front_ends_give_the_same_margins(nets, name):
    net, shape, proto, progs = nets[name]
    x = images(shape)
    with torch.no_grad():
        z = net(x)
    y = z.argmax(1)
    ref_graph = BoundGraph(proto)
    assert torch.allclose(ref_graph.logits(x).float(), z, atol=1e-5)
    ref = all_margins(ref_graph, x, y)
    assert (ref[("crown", "linf")] > -1e3).all() and (ref[("alpha", "l2")] > -1e3).all()
    assert not torch.equal(ref[("ibp", "linf")], ref[("alpha", "linf")])  # a real α-CROWN
    for how, gm in progs.items():
        graph = fx_bound_graph(gm)
        assert torch.allclose(graph.logits(x).float(), z, atol=1e-5), how
        assert_agree(all_margins(graph, x, y), ref, how)


def test_the_other_operators_agree_too(tmp_path):
    shape = (3, 4, 4)
    x = images(shape, 3)
    fx, plain = Mixed(mean=True).eval(), Mixed(mean=False).eval()
    with torch.no_grad():
        z = fx(x)
        y = z.argmax(1)
    ref = all_margins(BoundGraph(onnx_of(plain, shape)), x, y)
    for how, gm in programs(fx, shape, tmp_path).items():
        graph = fx_bound_graph(gm)
        assert torch.allclose(graph.logits(x).float(), z, atol=1e-5), how
        assert_agree(all_margins(graph, x, y), ref, how)


@pytest.mark.parametrize("channels,pre", [
    (3, Preprocessing(input_scale=255.0, mean=(120.0, 115.0, 100.0), std=(60.0, 58.0, 57.0),
                      channel_order="BGR")),
    (1, Preprocessing(mean=(0.5,), std=(0.25,))),
])
def test_preprocessing_gives_the_same_margins_on_both_front_ends(nets, channels, pre):
    """A 0–255 BGR model with mean/std (the CNN), a grayscale one on RGB images (an MLP)."""
    if channels == 3:
        net, shape, proto, progs = nets["cnn"]
        gm = progs["export"]
    else:
        net, shape = MLP(channels=1).eval(), (1, 4, 4)
        proto, gm = onnx_of(net, shape), exported(net, shape)
    im = InputMap(pre, channels, "NCHW")
    x = images((3, *shape[1:]))
    with torch.no_grad():
        z = net(im(x).float())
    y = z.argmax(1)
    ref_graph = BoundGraph(proto, input_map=im)
    assert torch.allclose(ref_graph.logits(x).float(), z, atol=1e-4)
    ref = all_margins(ref_graph, x, y)
    graph = fx_bound_graph(gm, input_map=im)
    assert torch.allclose(graph.logits(x).float(), z, atol=1e-4)
    assert_agree(all_margins(graph, x, y), ref, "preprocessed")


def test_a_final_softmax_is_left_out_on_both_front_ends():
    shape = (3, 4, 4)
    net, soft = MLP().eval(), MLP(softmax=True).eval()
    x = images(shape)
    with torch.no_grad():
        y = net(x).argmax(1)
        p = soft(x)
    ref = all_margins(BoundGraph(onnx_of(net, shape)), x, y)
    for graph in (BoundGraph(onnx_of(soft, shape)),
                  fx_bound_graph(exported(soft, shape))):
        assert graph.head == "Softmax"
        assert torch.allclose(graph.scores(x).float(), p, atol=1e-6)
        assert_agree(all_margins(graph, x, y), ref, "softmax")


def test_an_unsupported_operator_is_named():
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(torch.sigmoid(x).flatten(1))

    class Square(Odd):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin((x * x).flatten(1))

    with pytest.raises(BoundsUnavailable) as err:
        fx_bound_graph(exported(Odd().eval(), (1, 4, 4)))
    assert err.value.operator == "aten.sigmoid"
    assert "certified: not available (operator aten.sigmoid)" in str(err.value)
    with pytest.raises(BoundsUnavailable) as err:  # mapped, but not boundable: named as aten
        fx_bound_graph(exported(Square().eval(), (1, 4, 4)))
    assert err.value.operator == "aten.mul" and "product of two variable" in str(err.value)


@pytest.mark.parametrize("channels,layout,pre", [
    (3, "NCHW", Preprocessing(input_scale=255.0)),
    (3, "NCHW", Preprocessing(mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.25))),
    (3, "NCHW", Preprocessing(mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.25), channel_order="BGR")),
    (3, "NHWC", Preprocessing(input_scale=255.0, mean=(100.0, 110.0, 120.0),
                              std=(50.0, 60.0, 70.0), channel_order="BGR")),
    (1, "NCHW", Preprocessing(mean=(0.5,), std=(0.2,))),
    (1, "NHWC", Preprocessing(input_scale=255.0, mean=(128.0,), std=(64.0,))),
])
def test_input_map_pull_is_the_transpose_of_the_preprocessing(channels, layout, pre):
    """``pull(a)`` = (∂ (a · map(x)) / ∂x, a · map(0)) for every margin row (autograd)."""
    im = InputMap(pre, channels, layout)
    image = torch.Size((3, 4, 5))
    g = torch.Generator().manual_seed(7)
    x = torch.rand((2, *image), generator=g, dtype=torch.float64, requires_grad=True)
    u = im(x)
    a = torch.randn((2, 3, *u.shape[1:]), generator=g, dtype=torch.float64)
    coef, offset = im.pull(a, image)
    grads = [torch.autograd.grad((a[:, s] * u).sum(), x, retain_graph=True)[0]
             for s in range(a.shape[1])]
    assert torch.allclose(coef, torch.stack(grads, 1), atol=1e-10)
    zero = im(torch.zeros((1, *image), dtype=torch.float64))
    assert torch.allclose(offset, (a * zero.unsqueeze(1)).flatten(2).sum(2), atol=1e-9)
    exact = (a * u.detach().unsqueeze(1)).flatten(2).sum(2)
    assert torch.allclose((coef * x.detach().unsqueeze(1)).flatten(2).sum(2) + offset, exact,
                          atol=1e-8 * (1 + float(exact.abs().max())))
