"""Model adapters behind one interface (see :mod:`certify.models.base`)."""

from __future__ import annotations

from pathlib import Path

from certify.device import DeviceChoice
from certify.errors import ModelError
from certify.models.base import FeatureModel, Model, ModelInfo, Preprocessing, QueryCounter
from certify.models.http import HttpOptions

__all__ = [
    "FeatureModel",
    "HttpOptions",
    "Model",
    "ModelInfo",
    "Preprocessing",
    "QueryCounter",
    "load_model",
]


def load_model(
    spec: str,
    device: DeviceChoice,
    preprocessing: Preprocessing | None = None,
    input_size: tuple[int, int] | None = None,
    num_classes: int | None = None,
    http: HttpOptions | None = None,
    threads: int = 0,
) -> Model:
    """Load a model from a path (``.onnx``) or an endpoint URL (``http(s)://…``).

    ``threads`` caps onnxruntime's CPU threads (0: its default). Raises :class:`ModelError` when
    the model cannot be loaded, reached or used as a classifier.
    """
    if spec.startswith(("http://", "https://")):
        from certify.models.http import HttpModel

        return HttpModel(spec, device, preprocessing, input_size=input_size,
                         num_classes=num_classes, options=http)
    path = Path(spec)
    if path.is_dir():
        raise ModelError(f"{spec} is a directory, not a model file", hint="pass a .onnx file")
    from certify.models.onnx import OnnxModel

    return OnnxModel(path, device, preprocessing, input_size=input_size, num_classes=num_classes,
                     threads=threads)
