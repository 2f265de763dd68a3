"""The model interface: one verb, ``predict``, and one counting wrapper.

Inside certify an image batch is a float32 ``torch.Tensor`` of shape ``[N, C, H, W]`` with values
in ``[0, 1]``. Each adapter converts to its model's own input convention at its edge and returns
the model's scores as a ``[N, K]`` tensor (``ModelInfo.output`` says whether they are logits,
probabilities or one-hot labels).
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np

from certify.canonical import JSONLike
from certify.errors import BudgetExceeded, ModelError, NonFiniteOutput

if TYPE_CHECKING:
    import torch

OutputKind = Literal["logits", "probs", "labels"]
#: ``ModelInfo.white_box`` of a model certify can take gradients of (a torch copy of its graph).
WHITE_BOX = "available"
#: ``ModelInfo.white_box`` of a model whose graph certify does not have (an endpoint).
NO_GRAPH = "unavailable: the model's graph is not available (an endpoint), only its answers"
#: ``ModelInfo.white_box`` of an endpoint run with ``--surrogate`` starts with this: the
#: white-box attacks take gradients of the surrogate's graph, and the endpoint judges every
#: candidate they propose (a transfer attack, evidence that can break samples but never PASS).
TRANSFER = "transfer"


def transfer_text(surrogate: str) -> str:
    """``ModelInfo.white_box`` of an endpoint whose white-box attacks run on ``surrogate``."""
    return (f"{TRANSFER}: white-box attacks take gradients of the surrogate {surrogate} and "
            "every candidate is judged on this endpoint; their breaks count, their failures "
            "are not evidence of robustness")


@dataclass(frozen=True)
class Preprocessing:
    """How a model wants its pixels: value range, per-channel mean/std and channel order.

    A model input is ``((x * input_scale) - mean) / std`` with ``x`` in ``[0, 1]`` in RGB order,
    then reordered to BGR when ``channel_order`` says so.
    """

    input_scale: float = 1.0
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    channel_order: Literal["RGB", "BGR"] = "RGB"

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form, as it appears in results.json."""
        d = asdict(self)
        d["mean"] = list(self.mean)
        d["std"] = list(self.std)
        return d


@dataclass(frozen=True)
class ModelInfo:
    """What certify knows about a model once it is loaded.

    ``input_shape`` is ``(C, H, W)`` in certify's convention whatever the model's layout is.
    """

    name: str
    identity: str
    input_shape: tuple[int, int, int]
    num_classes: int
    output: OutputKind
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    batch: str = "dynamic"
    provider: str = "CPUExecutionProvider"
    preprocessing: Preprocessing = field(default_factory=Preprocessing)
    metadata: dict[str, str] = field(default_factory=dict)
    #: :data:`WHITE_BOX` when white-box attacks can run on a torch copy of the graph, else why
    #: not ("unavailable: ...", said on the card).
    white_box: str = NO_GRAPH

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form, as it appears in results.json."""
        d = asdict(self)
        d["input_shape"] = list(self.input_shape)
        d["preprocessing"] = self.preprocessing.to_dict()
        return d


@runtime_checkable
class BatchChecked(Protocol):
    """A model whose batching certify decided itself (an ONNX graph exported at batch 1 made
    symbolic) and checks once more on real images before the first check."""

    info: ModelInfo

    def confirm_batching(self, x: torch.Tensor) -> str | None:
        """Compare real images ``x`` alone and in batches; where they differ, run the model
        at its fixed batch from now on and return why (else ``None``)."""
        ...


@runtime_checkable
class Model(Protocol):
    """An image classifier: ``predict(x[N, C, H, W] in [0, 1]) -> scores[N, K]``."""

    info: ModelInfo

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Scores for a batch, on the same device as ``x``."""
        ...

    def close(self) -> None:
        """Release what the model holds (sessions, connections, programs); the model is not
        asked again afterwards."""
        ...


@runtime_checkable
class FeatureModel(Model, Protocol):
    """A model that can also return its penultimate features ``[N, D]``."""

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features for a batch."""
        ...


class RequestShape(Protocol):
    """How an endpoint is asked: ``batch`` images per request, ``concurrency`` requests in
    flight at once (what the engine sizes its batches and lanes by)."""

    @property
    def batch(self) -> int: ...
    @property
    def concurrency(self) -> int: ...


@runtime_checkable
class Endpoint(Model, Protocol):
    """A model behind an inference API: what the engine may use beyond ``predict``.

    ``options`` says the request size (``batch``) and the requests in flight
    (``concurrency``); ``traffic()`` counts requests, retries, hedges and failures;
    ``disable_hedging(why)`` stops duplicate requests (a randomised model, whose first answer
    would otherwise decide a record); ``surrogate`` is a local model whose graph the white-box
    attacks take gradients of (``--surrogate``; ``None`` without one). The one place the engine
    learns a model is an endpoint: :func:`endpoint_of`.
    """

    #: a local ONNX model whose graph white-box attacks use (a transfer attack), or ``None``
    surrogate: Model | None

    @property
    def options(self) -> RequestShape:
        """How the endpoint is asked (images per request, requests in flight)."""
        ...

    def traffic(self) -> dict[str, JSONLike]:
        """Traffic counts of this process so far (and how the endpoint is driven)."""
        ...

    def disable_hedging(self, why: str) -> None:
        """No more hedged requests, for the rest of the run."""
        ...

    def lane(self) -> AbstractContextManager[None]:
        """Register an engine lane while it runs a batch (its request queue sends early once
        every registered lane waits for an answer)."""
        ...


@runtime_checkable
class Reconfigurable(Model, Protocol):
    """A model that can be asked through another input preprocessing without reloading it:
    what :mod:`certify.probe` compares candidate preprocessings with."""

    def with_preprocessing(self, preprocessing: Preprocessing, layout: str | None = None
                           ) -> Model:
        """A view of this model that converts its inputs with ``preprocessing`` (and
        ``layout``, where the model does not state its own), sharing its runtime."""
        ...


def endpoint_of(model: object) -> Endpoint | None:
    """``model`` as an :class:`Endpoint`, or ``None`` for a model in this process."""
    return model if isinstance(model, Endpoint) else None


class Budget:
    """A query budget shared by several counters (e.g. a check's, or the whole run's).

    Budgets count model queries: images a model is asked about, whichever model (the certified
    one, the reference, feature extraction). They never count requests or retries, so a budget
    does not depend on network timing.
    """

    def __init__(self, limit: int | None, label: str = "query budget") -> None:
        self.limit = limit
        self.label = label
        self.spent = 0

    def refusal(self, n: int) -> str | None:
        """Why ``n`` more queries would exceed this budget, or ``None`` if they fit."""
        if self.limit is not None and self.spent + n > self.limit:
            return (f"{self.label} of {self.limit} would be exceeded "
                    f"({self.spent} used, {n} more asked)")
        return None


class QueryCounter:
    """Counts every image sent to the model and enforces the budgets it is charged to.

    Every model query in certify goes through one of these, so the number on the card is the
    number of images the model actually saw. ``budget`` is this counter's own limit
    (``None``: unlimited); ``shared`` are budgets it shares with other counters (a check's
    budget covers its reference model's queries too; the run's budget covers every check).
    """

    def __init__(self, model: Model, budget: int | None = None,
                 shared: tuple[Budget, ...] = ()) -> None:
        self.model = model
        self.info = model.info
        self.budget = budget
        self.shared = shared
        self.queries = 0
        self._budgets = (Budget(budget), *shared)
        self._closed = False

    def close(self) -> None:
        """Stop this counter: a later query is refused. The wrapped model is shared with
        other counters and stays open (whoever loaded it closes it)."""
        self._closed = True

    def _spend(self, x: torch.Tensor) -> None:
        if self._closed:
            raise ModelError("the model was asked after its counter was closed",
                             hint="report this as a bug in certify")
        n = int(x.shape[0])
        with _SPEND:  # budgets are shared by the in-process executor's lanes (threads)
            for b in self._budgets:
                refused = b.refusal(n)
                if refused:
                    raise BudgetExceeded(
                        refused,
                        hint="raise the budget in the suite or lower the number of samples")
            for b in self._budgets:
                b.spent += n
            self.queries += n

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Forward ``x`` to the model, counting ``len(x)`` queries.

        Raises :class:`NonFiniteOutput` (after counting) if any score is NaN or infinite.
        """
        self._spend(x)
        return _finite(self.model.predict(x), "outputs")

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features through the same count, budget and finiteness check."""
        self._spend(x)
        return _finite(self.model.features(x), "features")  # type: ignore[attr-defined]

    def has_features(self) -> bool:
        """Whether the wrapped model exposes penultimate features."""
        if isinstance(self.model, QueryCounter):
            return self.model.has_features()
        return getattr(self.model, "feature_name", None) is not None and hasattr(
            self.model, "features")

    def remaining(self) -> int | None:
        """Queries left, or ``None`` when unlimited."""
        return None if self.budget is None else self.budget - self.queries


def unwrapped(model: object) -> object:
    """The model behind query counters."""
    while isinstance(model, QueryCounter):
        model = model.model
    return model


#: Makes checking and charging several shared budgets one step across threads.
_SPEND = threading.Lock()


def _finite(out: torch.Tensor, what: str) -> torch.Tensor:
    import torch

    if out.is_floating_point() and not bool(torch.isfinite(out).all()):
        raise NonFiniteOutput(f"the model returned NaN or infinite {what}",
                              hint="the samples concerned are recorded as errors")
    return out


def require_finite_probe(out: np.ndarray, name: str) -> None:
    """Refuse a model whose answer to the probe images holds NaN or infinite scores (exit 3).

    Called when a model is loaded, before the run directory exists: such a model can be
    neither measured nor identified by its answers.
    """
    if np.issubdtype(out.dtype, np.floating) and not np.isfinite(out).all():
        bad = int((~np.isfinite(out)).reshape(len(out), -1).any(axis=1).sum())
        raise ModelError(
            f"{name} returned NaN or infinite scores for {bad} of {len(out)} probe images",
            hint="certify can only measure finite outputs: check the model's export "
                 "(a division by zero, a log of 0, an overflow in float16)",
        )


def to_model_input(x: torch.Tensor, pre: Preprocessing, channels: int, layout: str
                   ) -> np.ndarray:
    """certify's ``[N, C, H, W]`` RGB batch in ``[0, 1]`` as the model wants it (float32
    numpy): :func:`preprocess` without gradients."""
    out = preprocess(x.detach(), pre, channels, layout)
    return np.ascontiguousarray(out.cpu().numpy(), dtype=np.float32)


def preprocess(x: torch.Tensor, pre: Preprocessing, channels: int, layout: str
               ) -> torch.Tensor:
    """certify's ``[N, C, H, W]`` RGB batch in ``[0, 1]`` as the model wants it, in torch
    (differentiable: the white-box copy's input takes this path too).

    Grayscale models get the ITU-R 601 luma of RGB images; then scale, mean/std, channel order
    and layout are applied, in that order.
    """
    import torch

    c = channels
    if c == 1 and x.shape[1] == 3:
        w = torch.tensor([0.299, 0.587, 0.114], dtype=x.dtype, device=x.device)
        x = (x * w.view(1, 3, 1, 1)).sum(dim=1, keepdim=True)
    if pre.input_scale != 1.0:
        x = x * pre.input_scale
    if any(m != 0.0 for m in pre.mean) or any(s != 1.0 for s in pre.std):
        mean = torch.tensor(pre.mean[:c], dtype=x.dtype, device=x.device).view(1, c, 1, 1)
        std = torch.tensor(pre.std[:c], dtype=x.dtype, device=x.device).view(1, c, 1, 1)
        x = (x - mean) / std
    if pre.channel_order == "BGR" and c == 3:
        x = x.flip(1)
    if layout == "NHWC":
        x = x.permute(0, 2, 3, 1)
    return x


def as_scores(out: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """A model's answer for ``n`` images as ``[N, K]`` float scores: labels (a 1-D or integer
    answer) become one-hot over ``k`` classes, scores keep their values."""
    import torch

    if out.dim() == 1 or not out.is_floating_point():
        return torch.nn.functional.one_hot(out.reshape(n).long(), k).float()
    return out.reshape(n, -1 if n else k).float()  # no image: -1 would be ambiguous


def output_kind(out: np.ndarray) -> OutputKind:
    """Labels ``[N]``, probabilities (rows in [0, 1] summing to 1) or logits ``[N, K]``."""
    if out.ndim == 1:
        return "labels"
    if np.all(out >= -1e-6) and np.all(out <= 1 + 1e-6) and np.allclose(
        out.sum(axis=1), 1.0, atol=1e-3
    ):
        return "probs"
    return "logits"


def probe_images(shape: tuple[int, int, int], n: int = 4) -> torch.Tensor:
    """Fixed pseudo-random images used to probe a model's outputs when it is loaded."""
    import torch

    rng = np.random.default_rng(1234)
    return torch.from_numpy(rng.random((n, *shape), dtype=np.float32))


def image_layout(name: str, dims: list[int | str]) -> tuple[str, int, int | str, int | str]:
    """Return (layout, channels, height, width) or raise: the input must be an image."""
    if len(dims) == 4:
        if dims[1] in (1, 3):
            return "NCHW", int(dims[1]), dims[2], dims[3]
        if dims[3] in (1, 3):
            return "NHWC", int(dims[3]), dims[1], dims[2]
    raise ModelError(
        f"model input {name!r} has shape {dims}, which is not an image batch",
        hint="certify needs one input shaped [N, C, H, W] or [N, H, W, C] with C = 1 or 3",
    )
