"""Which graph of a model bound propagation reads, and how far it may trust its margins.

One operator table (:mod:`certify.models.bound_ops`), two front ends: an ONNX file's graph as
onnxruntime runs it (after certify's batch rewrite, where it made one), and the FX graph of aten
operations of a ``torch.export`` program (a ``.pt2`` file, or an in-memory module that
``torch.export`` traced; :mod:`certify.models.bound_fx`). Both take the model's own
preprocessing as their first, affine layer (:class:`~certify.models.bound_ops.InputMap`).
TorchScript programs, modules ``torch.export`` could not trace, ``predict`` objects and
endpoints have no graph certify can bound: ``certified: not available (format …)``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch

from certify.models.base import unwrapped
from certify.models.bound_ops import BoundGraph, BoundsUnavailable, InputMap
from certify.models.torchcopy import TOLERANCE

#: Bound graphs kept per process (a run bounds one model, a comparison two).
_CACHE_SIZE = 2
_cache: OrderedDict[tuple[Any, ...], BoundGraph] = OrderedDict()
_lock = threading.Lock()


def bound_graph_of(model: object, max_crown_neurons: int = 4096) -> BoundGraph:
    """The model's graph, ready to bound (built once per model and setting; its
    :attr:`batched` says whether it evaluates a batch at once or one sample at a time).

    Raises :class:`~certify.models.bound_ops.BoundsUnavailable` naming the format, the
    operator or the input certify cannot bound."""
    from certify.models.onnx import OnnxModel
    from certify.models.torchprog import FxProgram, TorchProgramModel

    inner = unwrapped(model)
    if isinstance(inner, OnnxModel):
        kind = "onnx"
    elif isinstance(inner, TorchProgramModel) and isinstance(inner.program, FxProgram):
        if not inner._float_input:
            raise BoundsUnavailable("(input)", "the program's input is an integer tensor: "
                                               "it rounds what the bounds take as continuous")
        kind = "fx"
    else:
        fmt = getattr(getattr(inner, "info", None), "metadata", {}).get("format") \
            or type(inner).__name__
        raise BoundsUnavailable("(format)", f"{fmt} has no graph certify can bound (an ONNX "
                                            "file or a torch.export program has)")
    info = inner.info
    key: tuple[Any, ...] = (kind, info.identity, info.batch, inner.preprocessing, inner.layout,
                            inner.input_shape, max_crown_neurons)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    graph = _build(inner, max_crown_neurons)
    graph.batched = _batches(graph, inner.input_shape)  # type: ignore[attr-defined]
    with _lock:
        _cache[key] = graph
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return graph


def _batches(graph: BoundGraph, shape: tuple[int, int, int]) -> bool:
    """Whether the graph evaluates two images at once (else one at a time, as a graph written
    for a fixed batch of 1 does); refused when it evaluates neither."""
    from certify.models.base import probe_images

    x = probe_images(shape, 2).to(torch.float64)
    try:
        if graph.logits(x).shape[0] == 2:
            return True
    except Exception:  # noqa: BLE001 - a graph whose shapes fix its batch
        pass
    try:
        graph.logits(x[:1])
    except Exception as exc:  # noqa: BLE001 - neither: said as the reason
        raise BoundsUnavailable("(batch)", f"the graph evaluates neither a batch nor one "
                                           f"image ({type(exc).__name__}: "
                                           f"{str(exc)[:160]})") from None
    return False


def graph_logits(graph: BoundGraph, x: torch.Tensor) -> torch.Tensor:
    """The graph's bounded output at ``x`` (float64), a batch at once or one image at a
    time as the graph takes them."""
    x = x.to(torch.float64)
    if getattr(graph, "batched", True):
        return graph.logits(x)
    return torch.cat([graph.logits(x[i:i + 1]) for i in range(len(x))])


def _build(inner: Any, max_crown_neurons: int) -> BoundGraph:
    from certify.models.onnx import OnnxModel

    input_map = InputMap(inner.preprocessing, inner.input_shape[0], inner.layout)
    if isinstance(inner, OnnxModel):
        graph = inner._proto.graph
        inits = {i.name for i in graph.initializer}
        image = next(i for i in graph.input if i.name not in inits)
        if image.type.tensor_type.elem_type not in (1, 11):  # FLOAT, DOUBLE
            raise BoundsUnavailable("(input)", "the graph's input is not a float tensor")
        return BoundGraph(inner._proto, max_crown_neurons=max_crown_neurons,
                          input_map=input_map)
    from certify.models.bound_fx import fx_bound_graph

    return fx_bound_graph(inner.program.gm, input_map, max_crown_neurons=max_crown_neurons)


def check_agreement(model: object, graph: BoundGraph) -> None:
    """Refuse (:class:`BoundsUnavailable`) a graph whose scores on certify's probe images are
    not the model's own: it would bound another function than the one the card names."""
    from certify.models.base import probe_images

    inner: Any = unwrapped(model)
    x = probe_images(inner.input_shape, 4)
    margin_tolerance(graph, x, inner.predict(x).detach().cpu(), inner.info.name)


def _as_model(graph: BoundGraph, logits: torch.Tensor) -> torch.Tensor:
    """The graph's bounded output as the model answers it: the same tensor, or its softmax
    (log-softmax) where the front end left out an order-keeping last Softmax (LogSoftmax)."""
    head = getattr(graph, "head", None)
    if head == "Softmax":
        return torch.softmax(logits, dim=1)
    if head == "LogSoftmax":
        return torch.log_softmax(logits, dim=1)
    return logits


def margin_tolerance(graph: BoundGraph, x: torch.Tensor, scores: torch.Tensor,
                     name: str) -> float:
    """How far above zero a margin's lower bound must be to prove a sample, from the graph's
    agreement with the model at the clean images ``x`` (the model's ``scores`` ``[N, K]``).

    The graph is evaluated in float64; the model answers in its own precision (float32 in
    onnxruntime). As for the white-box copy, the two may differ by :data:`TOLERANCE` times the
    scores' scale per score; a margin is a difference of two scores, so it must exceed twice
    that. A graph whose scores differ by more, or whose decisions differ, measured another
    function than the model: refused (:class:`BoundsUnavailable`)."""
    logits = graph_logits(graph, x).detach().cpu()
    ours = _as_model(graph, logits)
    theirs = scores.detach().cpu().to(torch.float64)
    if ours.shape != theirs.shape:
        raise BoundsUnavailable("(output)", f"the graph answers {tuple(ours.shape)} where "
                                            f"{name} answers {tuple(theirs.shape)}")
    scale = max(1.0, float(theirs.abs().max()) if theirs.numel() else 0.0)
    diff = float((ours - theirs).abs().max()) if theirs.numel() else 0.0
    if diff > TOLERANCE * scale or bool((ours.argmax(1) != theirs.argmax(1)).any()):
        raise BoundsUnavailable("(agreement)", f"the graph's float64 scores differ from "
                                f"{name}'s by up to {diff:.3g} (tolerance {TOLERANCE:g} × "
                                f"{scale:.3g})")
    logit_scale = max(1.0, float(logits.abs().max()) if logits.numel() else 0.0)
    return 2 * TOLERANCE * logit_scale
