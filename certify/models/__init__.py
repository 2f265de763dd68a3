"""Model adapters behind one interface (see :mod:`certify.models.base`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from certify.device import DeviceChoice
from certify.errors import ModelError, UsageError
from certify.models import registry
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
from certify.models.registry import LoadRequest
from certify.redact import redact

if TYPE_CHECKING:
    from certify.models.http import HttpOptions


def __getattr__(name: str) -> Any:
    """``HttpOptions``, imported on first use: what only reads a model's description
    (:mod:`certify.models.base`) does not import the HTTP client (issue 53)."""
    if name == "HttpOptions":
        from certify.models.http import HttpOptions

        return HttpOptions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

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
    """Load a model in any format the registry reads (:mod:`certify.models.registry`: an
    ONNX file, a PyTorch program, an endpoint URL).

    ``threads`` caps onnxruntime's CPU threads (0: its default). ``surrogate``: a local model
    file whose graph the white-box attacks use on an endpoint (:func:`attach_surrogate`).
    Raises :class:`ModelError` when the model cannot be loaded, reached or used as a
    classifier, or is refused (a pickle, an archive with a member that could run code).
    """
    request = LoadRequest(device, preprocessing, input_size, num_classes, http, threads)
    model = registry.load(spec, request)
    if surrogate is not None:
        if registry.is_endpoint(surrogate):
            raise UsageError(f"the surrogate must be a model file, not an endpoint "
                             f"({redact(surrogate)})",
                             hint="white-box attacks need the surrogate's graph")
        try:
            attach_surrogate(model, spec, registry.load(surrogate, request))
        except BaseException:
            model.close()
            raise
    return model


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
    try:
        surrogate.torch_copy()  # built now: the run's lanes share it
    except Exception:  # noqa: BLE001 - the run's plan tries the copy and says why it fails
        pass
    endpoint.surrogate = surrogate
    model.info = dataclasses.replace(
        mine, white_box=transfer_text(name),
        metadata={**mine.metadata, "surrogate": f"{name} ({theirs.identity})"})
