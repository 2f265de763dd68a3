"""Model adapters behind one interface (see :mod:`certify.models.base`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from certify.device import DeviceChoice
from certify.errors import ModelError, UsageError
from certify.models.base import (
    WHITE_BOX,
    FeatureModel,
    Model,
    ModelInfo,
    Preprocessing,
    QueryCounter,
    endpoint_of,
    transfer_text,
)
from certify.models.http import HttpOptions
from certify.redact import redact

__all__ = [
    "FeatureModel",
    "HttpOptions",
    "Model",
    "ModelInfo",
    "Preprocessing",
    "QueryCounter",
    "attach_surrogate",
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
    surrogate: str | None = None,
) -> Model:
    """Load a model from a path (``.onnx``) or an endpoint URL (``http(s)://…``).

    ``threads`` caps onnxruntime's CPU threads (0: its default). ``surrogate``: an ONNX file
    whose graph the white-box attacks use on an endpoint (:func:`attach_surrogate`). Raises
    :class:`ModelError` when the model cannot be loaded, reached or used as a classifier.
    """
    if spec.startswith(("http://", "https://")):
        from certify.models.http import HttpModel

        model: Model = HttpModel(spec, device, preprocessing, input_size=input_size,
                                 num_classes=num_classes, options=http)
    else:
        model = _onnx(spec, device, preprocessing, input_size, num_classes, threads)
    if surrogate is not None:
        attach_surrogate(model, spec, _onnx(surrogate, device, preprocessing, input_size,
                                            num_classes, threads, role="the surrogate"))
    return model


def _onnx(spec: str, device: DeviceChoice, preprocessing: Preprocessing | None,
          input_size: tuple[int, int] | None, num_classes: int | None, threads: int,
          role: str = "") -> Model:
    if role and spec.startswith(("http://", "https://")):
        raise UsageError(f"{role} must be an ONNX file, not an endpoint ({redact(spec)})",
                         hint="white-box attacks need the surrogate's graph")
    path = Path(spec)
    if path.is_dir():
        raise ModelError(f"{spec} is a directory, not a model file", hint="pass a .onnx file")
    from certify.models.onnx import OnnxModel

    return OnnxModel(path, device, preprocessing, input_size=input_size, num_classes=num_classes,
                     threads=threads)


def attach_surrogate(model: Model, spec: str, surrogate: Model) -> None:
    """Give the endpoint ``model`` a local ``surrogate`` (``--surrogate``): its white-box
    attacks then take gradients of the surrogate's torch copy and the endpoint judges every
    candidate (a transfer attack; ``ModelInfo.white_box`` says so on the card).

    Refused (:class:`UsageError` / :class:`ModelError`) for a model that is not an endpoint (an
    ONNX file is attacked through its own graph), and for a surrogate without a torch copy or
    with another input shape or class count than the endpoint.
    """
    from certify.models.torchcopy import WhiteBoxModel

    endpoint = endpoint_of(model)
    if endpoint is None:
        raise UsageError(f"--surrogate is for endpoints: {Path(spec).name} is a model file, "
                         "whose own graph the white-box attacks use",
                         hint="drop --surrogate")
    name = surrogate.info.name
    if surrogate.info.white_box != WHITE_BOX or not isinstance(surrogate, WhiteBoxModel):
        raise ModelError(f"the surrogate {name} cannot propose white-box candidates: "
                         f"{surrogate.info.white_box}",
                         hint="give a surrogate with a float input and supported operations")
    mine, theirs = model.info, surrogate.info
    if (theirs.input_shape, theirs.num_classes) != (mine.input_shape, mine.num_classes):
        raise ModelError(
            f"the surrogate {name} takes {list(theirs.input_shape)} and answers "
            f"{theirs.num_classes} classes; the endpoint takes {list(mine.input_shape)} and "
            f"answers {mine.num_classes}",
            hint="a surrogate must take the endpoint's images and name its classes")
    surrogate.torch_copy()  # built now: the run's lanes share it
    endpoint.surrogate = surrogate
    model.info = dataclasses.replace(
        mine, white_box=transfer_text(name),
        metadata={**mine.metadata, "surrogate": f"{name} ({theirs.identity})"})
