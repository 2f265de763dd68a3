"""The architecture corpus: small random-weight image classifiers of the families teams ship,
exported to ONNX as they export them (both of torch's exporters, several opsets, batch 1 and a
dynamic batch). Nothing is downloaded: the transformers come from ``transformers``
configurations, the CNNs without a ``transformers`` class are written here in plain torch.

Every model takes ``[N, 3, 32, 32]`` float32 in [0, 1] (the demo's signs) and answers
``[N, 43]`` logits.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

NUM_CLASSES = 43
SIZE = 32
#: torch's two exporters, as users call them
EXPORTERS = ("torchscript", "dynamo")
OPSETS = (13, 17, 20)


class Logits(nn.Module):
    """A ``transformers`` image classifier answering its logits tensor (what users export)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=x).logits


class _SqueezeExcite(nn.Module):
    def __init__(self, c: int, gate: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Sequential(nn.Conv2d(c, max(4, c // 4), 1), nn.ReLU(),
                                nn.Conv2d(max(4, c // 4), c, 1), gate())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.fc(self.pool(x))


class _InvertedResidual(nn.Module):
    """MobileNetV3's and EfficientNet's block: expand, depthwise, squeeze-excite, project."""

    def __init__(self, c_in: int, c_out: int, stride: int, act: Callable[[], nn.Module],
                 gate: Callable[[], nn.Module]) -> None:
        super().__init__()
        mid = c_in * 4
        self.body = nn.Sequential(
            nn.Conv2d(c_in, mid, 1, bias=False), nn.BatchNorm2d(mid), act(),
            nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid), act(),
            _SqueezeExcite(mid, gate),
            nn.Conv2d(mid, c_out, 1, bias=False), nn.BatchNorm2d(c_out))
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MobileNetV3Like(nn.Module):
    """MobileNetV3's building blocks (hard-swish, hard-sigmoid gates, depthwise convolutions),
    as torchvision writes them, at a toy width; ``efficient``: EfficientNet's MBConv instead
    (SiLU, sigmoid gates). ``transformers``' EfficientNet does not build at a toy width."""

    def __init__(self, efficient: bool = False) -> None:
        super().__init__()
        act: Callable[[], nn.Module] = nn.SiLU if efficient else nn.Hardswish
        gate: Callable[[], nn.Module] = nn.Sigmoid if efficient else nn.Hardsigmoid
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), act())
        self.blocks = nn.Sequential(_InvertedResidual(8, 8, 1, act, gate),
                                    _InvertedResidual(8, 16, 2, act, gate))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(16, 32), act(), nn.Dropout(0.2),
                                  nn.Linear(32, NUM_CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def _hf(name: str, eager: bool = False) -> nn.Module:
    import transformers as tr  # imported here: only the corpus needs it

    logging.getLogger("transformers").setLevel(logging.ERROR)
    common: dict = {"num_labels": NUM_CLASSES, "image_size": SIZE, "num_channels": 3}
    if eager:  # attention written out (no scaled_dot_product_attention)
        common["attn_implementation"] = "eager"
    if name == "resnet":
        model = tr.ResNetForImageClassification(tr.ResNetConfig(
            num_labels=NUM_CLASSES, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
            layer_type="basic"))
    elif name == "convnext":
        model = tr.ConvNextForImageClassification(tr.ConvNextConfig(
            num_labels=NUM_CLASSES, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1],
            patch_size=4))
    elif name == "vit":
        model = tr.ViTForImageClassification(tr.ViTConfig(
            **common, patch_size=4, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=64))
    elif name == "deit":
        model = tr.DeiTForImageClassificationWithTeacher(tr.DeiTConfig(
            **common, patch_size=4, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=64))
    elif name == "swin":
        model = tr.SwinForImageClassification(tr.SwinConfig(
            **common, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
            window_size=4))
    else:
        raise ValueError(name)
    return Logits(model)


#: family -> how to build it (random weights, eval mode; the flag: eager attention)
FAMILIES: dict[str, Callable[[bool], nn.Module]] = {
    "resnet": lambda eager: _hf("resnet"),
    "mobilenetv3": lambda eager: MobileNetV3Like(),
    "efficientnet": lambda eager: MobileNetV3Like(efficient=True),
    "convnext": lambda eager: _hf("convnext"),
    "vit": lambda eager: _hf("vit", eager),
    "deit": lambda eager: _hf("deit", eager),
    "swin": lambda eager: _hf("swin", eager),
}


def build(family: str, seed: int = 0, eager: bool = False) -> nn.Module:
    """A random-weight ``family`` classifier in eval mode (batch-norm statistics randomised,
    so folding them is not the identity); ``eager``: a transformer's attention written out
    instead of ``scaled_dot_product_attention``."""
    torch.manual_seed(seed)
    module = FAMILIES[family](eager)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return module.eval()


@dataclass(frozen=True)
class Export:
    """One corpus graph's recipe."""

    family: str
    exporter: str
    opset: int
    dynamic: bool

    @property
    def name(self) -> str:
        return (f"{self.family}-{self.exporter}-opset{self.opset}-"
                f"{'dynamic' if self.dynamic else 'batch1'}")


def export(module: nn.Module, spec: Export, path: Path) -> Path:
    """``module`` written to ``path`` as ``torch.onnx.export`` writes it for ``spec`` (the
    dynamo exporter's weights kept inside the file)."""
    # torch.export specialises a dimension of size 1: a dynamic batch is traced at 2
    dummy = torch.rand(2 if spec.dynamic and spec.exporter == "dynamo" else 1, 3, SIZE, SIZE)
    quiet = io.StringIO()
    with warnings.catch_warnings(), redirect_stdout(quiet), redirect_stderr(quiet):
        warnings.simplefilter("ignore")
        if spec.exporter == "torchscript":
            dynamic = ({"input": {0: "batch"}, "output": {0: "batch"}} if spec.dynamic
                       else None)
            torch.onnx.export(module, (dummy,), str(path), input_names=["input"],
                              output_names=["output"], dynamic_axes=dynamic, dynamo=False,
                              opset_version=spec.opset)
        else:
            shapes = ({"x": {0: torch.export.Dim("batch", min=1, max=1024)}}
                      if spec.dynamic else None)
            torch.onnx.export(module, (dummy,), str(path), input_names=["input"],
                              output_names=["output"], dynamic_shapes=shapes, dynamo=True,
                              opset_version=spec.opset, external_data=False, verbose=False)
    return path
