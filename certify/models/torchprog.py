"""PyTorch programs as models: ``torch.export`` archives (``.pt2``), TorchScript files and
``torch.nn.Module`` objects in memory (the Python API), plus black-box ``predict`` objects.

A program is run as it was saved, with its own operations and weights: ``predict`` is one
forward pass, and the white-box attacks take the program's own gradients (no ONNX conversion,
no torch copy). As on the ONNX path (:mod:`certify.models.torchcopy`), the gradient is taken at
the output of the program's last linear layer (the *cut*) and the decisions after the whole
program, so a rounding or arg-max head does not starve the attacks of gradients (BPDA):

- an exported program is an FX graph of aten operations: the cut is found in it and read with an
  interpreter (:class:`FxProgram`);
- a TorchScript program's graph is inlined and given the cut as a second output, a TorchScript
  function of the same operations (:class:`ScriptProgram`);
- a module that ``torch.export`` cannot trace is run as it is, its gradient taken at its output
  (:class:`ModuleProgram`; the card says so).

Files are checked by :mod:`certify.models.torchsafety` before torch loads them. Shapes:
``x`` ``[N, C, H, W]`` float32 in ``[0, 1]`` (certify's convention); the program gets it after
the suite's preprocessing (scale, mean/std, channel order, layout), like an ONNX model.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import io
import logging
import threading
import typing
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from certify.device import DeviceChoice
from certify.errors import ModelError
from certify.models.base import (
    WHITE_BOX,
    ModelInfo,
    OutputKind,
    Preprocessing,
    as_scores,
    image_layout,
    output_kind,
    preprocess,
    probe_images,
    require_finite_probe,
)
from certify.models.batching import same_alone_and_batched
from certify.models.torchcopy import (
    QUANTISING_NAMES,
    TOLERANCE,
    WhiteBoxUnavailable,
    batches,
    per_sample,
)

#: Operations whose data input is the network's penultimate features (the binarization test's
#: feature extractor): a product with a constant weight matrix. The one rule of both paths: on
#: an ONNX graph, Gemm or MatMul with a constant weight (:func:`certify.models.onnx.
#: _penultimate`); on a program, these aten operations. A 1×1 convolution is a linear layer
#: for the cut (below), not a feature layer, on either path.
FEATURE_OPS = frozenset({"linear", "addmm", "mm", "matmul"})

#: Operations that are a linear layer (the cut is the output of the one that feeds the answer).
log = logging.getLogger("certify")

#: A convolution counts too: a 1×1 convolution over a 1×1 map is a linear layer (the cut is
#: then kept only where it is ``num_classes`` wide and the head reproduces the answer).
_LINEAR = frozenset({"linear", "addmm", "mm", "matmul", "conv2d", "convolution",
                     "_convolution"})
#: Per-sample operations a head may hold between the last linear layer and the answer (the
#: same role as torchcopy.HEAD_OPS for ONNX graphs); anything else ends the walk back.
HEAD_OPS = frozenset({"round", "floor", "ceil", "trunc", "mul", "div", "add", "sub", "softmax",
                      "_softmax", "log_softmax", "_log_softmax", "clamp", "clip", "sigmoid",
                      "relu", "neg", "exp", "log", "argmax", "topk", "getitem", "sign", "to",
                      "_to_copy", "type_as", "alias", "clone", "detach", "contiguous",
                      "quantize_per_tensor", "dequantize", "fake_quantize_per_tensor_affine",
                      "hardtanh", "tanh", "view", "reshape", "_unsafe_view", "flatten",
                      "squeeze", "unsqueeze"})
#: A bias added to the linear layer's output belongs to the layer (as a Gemm's does): the cut
#: moves over it, so that the head never needs the model's own class count.
_BIAS = frozenset({"add"})


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """Silence torch's own warnings while it loads or traces a program (``torch.jit.*`` is
    deprecated in torch 2.13 and says so on every call; the test configuration makes warnings
    errors). certify's own messages say what matters."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _first_tensor(out: Any) -> torch.Tensor:
    """The first tensor of a program's output (a tensor, a tuple, a list or a dict)."""
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            return leaf
    raise ModelError("the program's output holds no tensor",
                     hint="certify needs class scores [N, K] or labels [N]")


def _op_name(target: Any) -> str:
    """``aten.round.default`` → ``round``; a Python callable → its name."""
    name = getattr(target, "_opname", None) or getattr(target, "__name__", None) or str(target)
    return str(name).split(".")[-1] if "." in str(name) else str(name)


class Program(Protocol):
    """A loaded program: its answer, its answer with the cut, and its head on its own."""

    #: the operations after the cut, in order (empty: the cut is the output)
    head: tuple[str, ...]

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """The program's answer (its first output tensor) for a model-convention input."""
        ...

    def run_cut(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the cut's tensor, the program's answer), gradients flowing."""
        ...

    def run_head(self, logits: torch.Tensor) -> torch.Tensor:
        """The head applied to ``logits`` in place of the cut; raises WhiteBoxUnavailable when
        the head needs more than the cut."""
        ...

    def drop_cut(self) -> None:
        """Forget the cut: gradients are then taken at the answer."""
        ...


class FxProgram:
    """An exported program's graph (``ExportedProgram.module()``), with its cut."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        nodes = list(gm.graph.nodes)
        self._output = next(n for n in nodes if n.op == "output")
        out_leaves, _ = torch.utils._pytree.tree_flatten(self._output.args[0])
        answer = next((a for a in out_leaves if isinstance(a, torch.fx.Node)), None)
        if answer is None:
            raise ModelError("the exported program returns no tensor",
                             hint="certify needs class scores [N, K] or labels [N]")
        self._answer: torch.fx.Node = answer
        self._cut: torch.fx.Node = answer
        self._head_nodes: list[torch.fx.Node] = []
        self._outside: set[torch.fx.Node] = set()
        varying = _input_dependent(nodes)
        head: list[torch.fx.Node] = []
        node = answer
        while node.op == "call_function":  # back from the answer through the head
            inputs = [a for a in node.all_input_nodes if a in varying]
            if _op_name(node.target) in _LINEAR and len(inputs) == 1 \
                    and len(node.all_input_nodes) > 1:
                while head and _op_name(head[-1].target) in _BIAS and \
                        len([a for a in head[-1].all_input_nodes if a in varying]) == 1:
                    node = head.pop()  # the layer's bias: the cut moves over it
                self._set_cut(node, head[::-1])
                break
            if _op_name(node.target) not in HEAD_OPS or len(inputs) != 1:
                break
            head.append(node)
            node = inputs[0]
        self.head = tuple(_op_name(n.target) for n in self._head_nodes)
        #: the penultimate features: the data input of the last :data:`FEATURE_OPS` node
        self._feature: torch.fx.Node | None = None
        self.feature_op = ""
        for n in reversed(nodes):
            if n.op == "call_function" and _op_name(n.target) in FEATURE_OPS:
                data = [a for a in n.all_input_nodes if a in varying]
                if len(data) == 1 and len(n.all_input_nodes) > 1:
                    self._feature, self.feature_op = data[0], _op_name(n.target)
                    break

    def run_features(self, x: torch.Tensor) -> torch.Tensor | None:
        """The penultimate features ``[N, ...]`` (``None``: the graph has no feature layer)."""
        if self._feature is None:
            return None
        interp = torch.fx.Interpreter(self.gm, garbage_collect_values=False)
        interp.run(x)
        return typing.cast(torch.Tensor, interp.env[self._feature])

    def _set_cut(self, cut: torch.fx.Node, head: list[torch.fx.Node]) -> None:
        self._cut = cut
        self._head_nodes = head
        self._outside = {a for n in head for a in n.all_input_nodes
                         if a is not cut and a not in head}

    def drop_cut(self) -> None:
        """Take gradients at the answer (the cut did not reproduce it)."""
        self._cut, self._head_nodes, self._outside, self.head = self._answer, [], set(), ()

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """The graph's answer (compiled forward)."""
        return _first_tensor(self.gm(x))

    def run_cut(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the cut's tensor, the answer), read with an FX interpreter."""
        interp = torch.fx.Interpreter(self.gm, garbage_collect_values=False)
        interp.run(x)
        return interp.env[self._cut], interp.env[self._answer]

    def run_head(self, logits: torch.Tensor) -> torch.Tensor:
        """The head's operations on ``logits`` (constants fetched; anything else refused)."""
        if any(a.op != "get_attr" for a in self._outside):
            raise WhiteBoxUnavailable("the output head needs more than the last linear "
                                      "layer's output")
        interp = torch.fx.Interpreter(self.gm, garbage_collect_values=False)
        interp.env = {self._cut: logits}
        for a in self._outside:
            interp.env[a] = interp.fetch_attr(str(a.target))
        for n in self._head_nodes:
            interp.env[n] = interp.run_node(n)
        return interp.env[self._answer] if self._head_nodes else logits


def _input_dependent(nodes: list[torch.fx.Node]) -> set[torch.fx.Node]:
    """The nodes whose value depends on the program's input (the rest are constants)."""
    varying: set[torch.fx.Node] = set()
    for n in nodes:  # topological order
        if n.op == "placeholder" or any(a in varying for a in n.all_input_nodes):
            varying.add(n)
    return varying


class ScriptProgram:
    """A TorchScript program, and a TorchScript function of its inlined graph that returns the
    cut beside the answer (the same operations, the program's own weights)."""

    def __init__(self, module: torch.jit.ScriptModule) -> None:
        self.module = module
        self._cut_fn: Any = None
        self._head_fn: Any = None
        self._feature_fn: Any = None
        self.feature_op = ""
        self.head: tuple[str, ...] = ()
        self.why_no_cut = ""
        with quiet_torch():
            try:
                self._build_cut()
            except Exception as exc:  # noqa: BLE001 - a graph certify cannot cut: said
                self.why_no_cut = f"{type(exc).__name__}: {str(exc)[:200]}"
                self._cut_fn = None
            try:
                self._build_features()
            except Exception:  # noqa: BLE001 - no feature layer read: the output is used
                self._feature_fn, self.feature_op = None, ""

    def _build_features(self) -> None:
        """A TorchScript function of the inlined graph that returns the data input of its
        last :data:`FEATURE_OPS` node (the penultimate features)."""
        graph = self.module.inlined_graph
        image = list(graph.inputs())[1]
        varying = {image}
        last = None
        for n in graph.nodes():
            if _reads_any(n, varying):  # a branch's block may read the input from outside
                varying.update(n.outputs())
            kind = n.kind()
            if kind.startswith("aten::") and kind.split("::")[-1] in FEATURE_OPS:
                data = [i for i in n.inputs() if i in varying]
                if len(data) == 1 and len(list(n.inputs())) > 1:
                    last = (n, data[0])
        if last is None:
            return
        node, value = last
        op = node.kind().split("::")[-1]  # before the pass below frees the node
        ret = graph.return_node()
        ret.replaceInput(0, value)
        torch._C._jit_pass_dce(graph)
        self._feature_fn = torch._C._create_function_from_graph("certify_features", graph)
        self.feature_op = op

    def run_features(self, x: torch.Tensor) -> torch.Tensor | None:
        """The penultimate features ``[N, ...]`` (``None``: no feature layer was found)."""
        if self._feature_fn is None:
            return None
        return _first_tensor(self._feature_fn(self.module._c, x))

    def _build_cut(self) -> None:
        graph = self.module.inlined_graph
        image = list(graph.inputs())[1]
        varying = {image}
        for n in graph.nodes():  # the values that depend on the input (no control flow)
            if any(i in varying for i in n.inputs()):
                varying.update(n.outputs())
        answer = graph.return_node().input()
        if answer.node().kind() == "prim::TupleConstruct":
            answer = next(iter(answer.node().inputs()))
        node, passed = answer.node(), []
        while True:  # back from the answer through the head
            kind = node.kind().split("::")[-1]
            inputs = [i for i in node.inputs() if i in varying]
            if kind in _LINEAR and len(inputs) == 1 and node.kind().startswith("aten::"):
                break
            if not node.kind().startswith("aten::") or kind not in HEAD_OPS \
                    or len(inputs) != 1:
                return  # no cut: gradients at the answer
            passed.append(node)
            node = inputs[0].node()
        while passed and passed[-1].kind().split("::")[-1] in _BIAS:
            node = passed.pop()  # the layer's bias: the cut moves over it
        head = [n.kind().split("::")[-1] for n in passed]
        if not head:
            return
        cut = node.output()
        ret = graph.return_node()
        pair = graph.create("prim::TupleConstruct", [cut, ret.input()], 1)
        pair.insertBefore(ret)
        pair.output().setType(torch._C.TupleType([cut.type(), ret.input().type()]))
        ret.replaceInput(0, pair.output())
        self._cut_fn = torch._C._create_function_from_graph("certify_cut", graph)
        self.head = tuple(head[::-1])
        head_graph = self.module.inlined_graph
        same = [n for n in head_graph.nodes() if n.kind() == node.kind()]
        target = same[[n for n in graph.nodes() if n.kind() == node.kind()].index(node)]
        logits = head_graph.addInput("logits")
        logits.setType(target.output().type())
        target.output().replaceAllUsesWith(logits)
        back = head_graph.return_node()
        if back.input().node().kind() == "prim::TupleConstruct":  # the answer alone
            back.replaceInput(0, next(iter(back.input().node().inputs())))
        torch._C._jit_pass_dce(head_graph)
        _drop_unneeded(head_graph)  # checks on the body's input (a pooling's rank check)
        if not list(head_graph.inputs())[1].uses():
            self._head_fn = torch._C._create_function_from_graph("certify_head", head_graph)

    def drop_cut(self) -> None:
        """Take gradients at the answer (the cut did not reproduce it)."""
        self._cut_fn = self._head_fn = None
        self.head = ()

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """The program's answer."""
        return _first_tensor(self.module(x))

    def run_cut(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the cut's tensor, the answer); the answer twice without a head."""
        if self._cut_fn is None:
            out = self.run(x)
            return out, out
        cut, out = self._cut_fn(self.module._c, x)
        return cut, _first_tensor(out)

    def run_head(self, logits: torch.Tensor) -> torch.Tensor:
        """The head's operations on ``logits``."""
        if not self.head:
            return logits
        if self._head_fn is None:
            raise WhiteBoxUnavailable("the output head needs more than the last linear "
                                      "layer's output")
        return _first_tensor(self._head_fn(self.module._c, torch.empty(0), logits))


def _reads_any(node: Any, values: set[Any]) -> bool:
    """Whether a TorchScript node, or any node of its blocks (a ``prim::If``'s branches),
    reads one of ``values``."""
    if any(i in values for i in node.inputs()):
        return True
    return any(_reads_any(inner, values) for block in node.blocks() for inner in block.nodes())


def _drop_unneeded(graph: Any) -> None:
    """Remove the top-level nodes of a TorchScript graph whose outputs the answer does not need,
    side effects included: what is left of the program after its cut runs on the logits alone,
    and a check the body makes of its own input (``prim::If`` … ``prim::RaiseException`` of a
    pooling layer) belongs to the body."""
    needed: set[Any] = set()
    todo = [v.node() for v in graph.return_node().inputs()]
    while todo:
        node = todo.pop()
        if node in needed:
            continue
        needed.add(node)
        todo.extend(v.node() for v in node.inputs())
        for block in node.blocks():  # values a subgraph reads from outside it
            for inner in block.nodes():
                todo.extend(v.node() for v in inner.inputs())
    for node in reversed(list(graph.nodes())):
        if node not in needed and all(not o.uses() for o in node.outputs()):
            node.destroy()


class ModuleProgram:
    """A module run as it is (it could not be exported): gradients at its output."""

    head: tuple[str, ...] = ()

    def drop_cut(self) -> None:
        """Nothing to drop: there is no cut."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """The module's answer."""
        return _first_tensor(self.module(x))

    def run_cut(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The answer twice (no cut)."""
        out = self.run(x)
        return out, out

    def run_head(self, logits: torch.Tensor) -> torch.Tensor:
        """No head: the logits."""
        return logits


class ProgramGradients:
    """The white-box view of a program (what :class:`~certify.models.torchcopy.TorchCopy` is
    for an ONNX graph): scores after the whole program, the loss and its input gradient at the
    cut. ``x`` is in certify's convention; preprocessing is applied here, differentiably."""

    def __init__(self, program: Program, pre: Preprocessing, channels: int, layout: str,
                 num_classes: int, fixed_batch: int | None, cut_axes: int = 2) -> None:
        self.program = program
        self.pre = pre
        self.channels = channels
        self.layout = layout
        self.num_classes = num_classes
        self.fixed_batch = fixed_batch
        self.head = program.head
        self.quantised = any(op in QUANTISING_NAMES for op in self.head)
        #: the cut's rank (2: ``[N, K]``; 4 after a 1×1 convolution)
        self.cut_axes = cut_axes

    def _as_scores(self, out: torch.Tensor, n: int) -> torch.Tensor:
        return as_scores(out, n, self.num_classes)

    @torch.no_grad()
    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """The program's answer ``[N, K]`` (one-hot for labels), the program run at the batch
        it takes (:func:`~certify.models.torchcopy.per_sample`)."""
        if not len(x):
            return torch.zeros(0, self.num_classes)
        (out,) = per_sample(lambda p: (self.program.run(self._input(p)),), x, self.fixed_batch)
        return self._as_scores(out, len(x))

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`scores` (a white-box attack's forward pass)."""
        return self.scores(x)

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        return preprocess(x, self.pre, self.channels, self.layout)

    @torch.no_grad()
    def apply_head(self, logits: torch.Tensor) -> torch.Tensor:
        """The program's operations after the cut applied to ``logits`` ``[N, K']`` (given the
        cut's unit axes, e.g. ``[N, K', 1, 1]`` after a 1×1 convolution); raises
        :class:`WhiteBoxUnavailable` when they cannot run on it (a head that needs the
        program's own class count)."""
        try:
            shaped = logits.reshape(*logits.shape, *[1] * (self.cut_axes - 2))
            return as_scores(self.program.run_head(shaped), *logits.shape)
        except WhiteBoxUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure: the head cannot be used
            raise WhiteBoxUnavailable(
                f"the output head ({', '.join(self.head)}) failed on a readout of "
                f"{logits.shape[1]} classes: {type(exc).__name__}: {str(exc)[:200]}") from None

    def value_and_grad(self, x: torch.Tensor, loss: Callable[[torch.Tensor], torch.Tensor]
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One forward and backward pass: (scores, cut logits, ``loss(cut)``, its gradient with
        respect to ``x``), all detached; the loss at the cut, the decisions after the head."""
        xg = x.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            cut, out = per_sample(lambda p: self.program.run_cut(self._input(p)), xg,
                                  self.fixed_batch)
            cut_all = cut.reshape(len(x), -1).float()
            value = loss(cut_all)  # one loss over the whole batch (its targets are per row)
            (grad,) = torch.autograd.grad(value.sum(), xg)
        return (self._as_scores(out.detach(), len(x)), cut_all.detach(), value.detach(),
                grad.detach())


def program_digest(ep: Any) -> str:
    """``sha256:<hex>`` of an exported program: its graph's code and every tensor it holds
    (parameters, buffers and constants, by name, with dtype and shape), non-tensor constants by
    their type: the identity of a module in memory."""
    h = hashlib.sha256(b"certify-program-digest-v2\n")
    h.update(ep.graph_module.code.encode())
    named: dict[str, Any] = {f"state:{k}": v for k, v in ep.state_dict.items()}
    named.update({f"const:{k}": v for k, v in ep.constants.items()})
    for name in sorted(named):
        value = named[name]
        if not isinstance(value, torch.Tensor):
            h.update(f"{name} {type(value).__qualname__}\n".encode())
            continue
        t = value.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name} {t.dtype} {list(value.shape)}\n".encode())
        if t.numel():
            h.update(t.view(torch.uint8).numpy().tobytes())
    return f"sha256:{h.hexdigest()}"


class TorchProgramModel:
    """A PyTorch program as a local white-box model (see the module's docstring).

    Built by :func:`load_pt2`, :func:`load_torchscript` and :func:`from_module`; ``predict``
    runs the program, :meth:`torch_copy` gives the attacks its gradients.
    """

    feature_name: str | None = None

    def __init__(self, program: Program, *, name: str, identity: str, input_shape:
                 tuple[int, int, int], layout: str, device: DeviceChoice,
                 preprocessing: Preprocessing | None, num_classes: int | None,
                 fixed_batch: int | None, float_input: bool, kind: str,
                 white_box_note: str = "", exported_batch: int | None = None,
                 batching_note: str | None = None) -> None:
        self.program = program
        self.preprocessing = preprocessing or Preprocessing()
        self.layout = layout
        self.input_shape = input_shape
        self.fixed_batch = fixed_batch
        #: the batch the program was exported at, where certify decided to batch it anyway
        #: (checked again on real images: :meth:`confirm_batching`)
        self._exported_batch = exported_batch
        self._device = device.torch_device
        self._float_input = float_input
        probe = self._raw(probe_images(input_shape)).detach().cpu()
        if probe.dim() not in (1, 2) or probe.shape[0] != 4:
            raise ModelError(f"{name} answers shape {list(probe.shape)} for 4 images",
                             hint="certify needs class scores [N, K] or labels [N]")
        arr = probe.numpy() if probe.is_floating_point() else probe.numpy().astype(np.int64)
        require_finite_probe(arr, name)
        output: OutputKind = output_kind(arr)
        k = int(arr.shape[1]) if arr.ndim == 2 else int(num_classes or 0)
        if output == "labels" and not k:
            raise ModelError("the program returns labels but the number of classes is unknown",
                             hint="name the classes: --labels FILE or classes in the suite")
        self.num_classes = k
        self.output_kind = output
        self.cut_axes = 2
        if float_input:
            self._verify_cut(probe_images(input_shape))
        why = None if float_input else ("the program's input is an integer tensor: it has no "
                                        "gradient, so only black-box attacks apply")
        self._white_box_refusal = why
        self._gradients: ProgramGradients | None = None
        batch = "dynamic" if fixed_batch is None else f"fixed {fixed_batch} (chunked)"
        self.info = ModelInfo(
            name=name, identity=identity, input_shape=input_shape, num_classes=k,
            output=output, layout=layout,  # type: ignore[arg-type]
            batch=batch, provider=f"torch {torch.__version__} ({self._device.type})",
            preprocessing=self.preprocessing, metadata={"format": kind},
            white_box=(WHITE_BOX if why is None else f"unavailable: {why}"))
        if white_box_note:
            self.info.metadata["white_box"] = white_box_note
        op = getattr(program, "feature_op", "")
        self.feature_name = f"input of the last {op} (penultimate features)" if op else None
        if batching_note:
            self.info.metadata["batching"] = batching_note
        self._lock = threading.Lock()
        if why is None:
            starved = self.starved(probe_images(input_shape))
            if starved is not None:
                self.refuse_white_box(f"{starved} (a quantising output without a linear layer "
                                      "certify can cut before, or operations without "
                                      "gradients such as the MKLDNN kernels of "
                                      "torch.jit.optimize_for_inference): only black-box "
                                      "attacks apply")

    def _verify_cut(self, x: torch.Tensor) -> None:
        """Keep the cut only where it is the classifier's scores: ``num_classes`` wide, and the
        head applied to it gives the program's answer; else gradients at the answer."""
        if not self.program.head:
            return
        part, n = next(batches(preprocess(x.to(self._device), self.preprocessing,
                                          self.input_shape[0], self.layout), self.fixed_batch))
        try:
            with torch.no_grad():
                cut, out = self.program.run_cut(part)
                again = self.program.run_head(cut)
            # a 1×1 convolution's cut is [N, K, 1, 1]: K wide once its unit axes are dropped
            ok = (cut.dim() >= 2 and all(d == 1 for d in cut.shape[2:])
                  and cut.shape[1] == self.num_classes
                  and again.shape == out.shape
                  and bool(torch.allclose(again.float(), out.float(), atol=1e-5)))
        except Exception:  # noqa: BLE001 - a head that cannot run on the cut: no cut
            ok = False
        if ok:
            self.cut_axes = cut.dim()
        else:
            self.program.drop_cut()

    def starved(self, x: torch.Tensor) -> str | None:
        """Why the gradient at the cut carries nothing on probe images ``x`` (zero everywhere,
        or no gradient at all: a quantising answer with no linear layer to cut before), or
        ``None`` when it flows."""
        part, n = next(batches(x.to(self._device), self.fixed_batch))
        xg = part.detach().clone().requires_grad_(True)
        try:
            with torch.enable_grad():
                cut, _ = self.program.run_cut(preprocess(xg, self.preprocessing,
                                                         self.input_shape[0], self.layout))
                if not cut.is_floating_point() or not cut.requires_grad:
                    return "its answer has no gradient"
                (grad,) = torch.autograd.grad(cut.float().sum(), xg, allow_unused=True)
        except Exception as exc:  # noqa: BLE001 - a program that cannot be differentiated
            return f"it cannot be differentiated ({type(exc).__name__}: {str(exc)[:120]})"
        if grad is None or not bool(grad.abs().sum() > 0):
            return "its gradient is zero on probe images"
        return None

    def with_preprocessing(self, preprocessing: Preprocessing, layout: str | None = None
                           ) -> TorchProgramModel:
        """This program asked through another input preprocessing (no reload): how
        ``certify init`` tries candidates. Its layout is its own; another is refused."""
        if layout is not None and layout != self.layout:
            raise ModelError(f"{self.info.name} takes {self.layout} input, not {layout}",
                             hint="the layout follows the program")
        other = copy.copy(self)
        other.preprocessing = preprocessing
        other.info = dataclasses.replace(self.info, preprocessing=preprocessing)
        other._gradients = None
        return other

    def refuse_white_box(self, why: str) -> None:
        """No white-box attacks on this model, for the reason ``why`` (said on the card)."""
        self._white_box_refusal = why
        self.info = dataclasses.replace(self.info, white_box=f"unavailable: {why}")

    def _model_input(self, x: torch.Tensor) -> torch.Tensor:
        inp = preprocess(x.to(self._device), self.preprocessing, self.input_shape[0],
                         self.layout)
        if not self._float_input:
            inp = inp.round().clamp(0, 255).to(torch.uint8)
        return inp

    def confirm_batching(self, x: torch.Tensor) -> str | None:
        """Where certify batches a program exported at batch 1, check real images ``x`` alone
        and in batches once more; where they differ, run it one image at a time from now on.
        Returns why it changed, or ``None`` (not counted as queries)."""
        if self._exported_batch is None or self.fixed_batch is not None:
            return None
        why = batch_disagreement(self.program.run, self._model_input(x))
        if why is None:
            return None
        self.fixed_batch = self._exported_batch
        self._gradients = None
        note = _batching_note(self._exported_batch, f"on the run's real images: {why}")
        self.info = dataclasses.replace(self.info, batch=f"fixed {self.fixed_batch} (chunked)",
                                        metadata={**self.info.metadata, "batching": note})
        log.warning("model batch dimension: back to fixed %d: %s", self.fixed_batch, why)
        return why

    def _raw(self, x: torch.Tensor) -> torch.Tensor:
        inp = self._model_input(x)
        with torch.no_grad():
            if self.fixed_batch is None:
                return self.program.run(inp)
            return torch.cat([self.program.run(part)[:n]
                              for part, n in batches(inp, self.fixed_batch)])

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Scores ``[N, K]`` for images ``x`` ``[N, C, H, W]`` in ``[0, 1]``."""
        return as_scores(self._raw(x), len(x), self.num_classes).to(x.device)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features ``[N, D]``: the data input of the program's last feature layer
        (:data:`FEATURE_OPS`), as the ONNX adapter reads the input of its last Gemm/MatMul.
        Raises :class:`ModelError` when the program has none (``feature_name`` is None)."""
        run = getattr(self.program, "run_features", None)
        if self.feature_name is None or run is None:
            raise ModelError(f"{self.info.name} exposes no penultimate features",
                             hint="the binarization test then reads the model's output")
        inp = self._model_input(x)
        with torch.no_grad():
            parts = ([(inp, len(inp))] if self.fixed_batch is None
                     else list(batches(inp, self.fixed_batch)))
            feats = torch.cat([run(part)[:n].reshape(n, -1) for part, n in parts])
        return feats.float().to(x.device)

    def torch_copy(self) -> ProgramGradients:
        """The program's own gradients for the white-box attacks (no copy: the name is the
        white-box interface's). Raises WhiteBoxUnavailable for an integer input."""
        if self._white_box_refusal is not None:
            raise WhiteBoxUnavailable(self._white_box_refusal)
        with self._lock:
            if self._gradients is None:
                self._gradients = ProgramGradients(
                    self.program, self.preprocessing, self.input_shape[0], self.layout,
                    self.num_classes, self.fixed_batch, self.cut_axes)
        return self._gradients

    def close(self) -> None:
        """Drop the white-box view (the program's weights are freed with the model)."""
        self._gradients = None


def batch_disagreement(run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
                       ) -> str | None:
    """Why a batch does not give each of the images ``x`` (the program's input convention)
    the answer it gets alone (a batch size baked into a traced graph, an answer that depends
    on the whole input tensor), or ``None`` when every batch make-up tried agrees
    (:func:`certify.models.batching.same_alone_and_batched`)."""
    def call(arr: np.ndarray) -> np.ndarray:
        with torch.no_grad(), quiet_torch():
            out = run(torch.from_numpy(arr).to(x.device))
        return out.detach().float().cpu().numpy()
    try:
        return same_alone_and_batched(call, call, x.detach().cpu().numpy(), TOLERANCE)
    except Exception as exc:  # noqa: BLE001 - any failure: the program takes its own batch
        return f"a batch of several images fails ({type(exc).__name__}: {str(exc)[:120]})"


def _batching_note(exported: int | None, why: str | None) -> str:
    """How a program exported at a fixed batch is batched, in a sentence (the card's)."""
    if why is None:
        return (f"exported at batch {exported}; run on batches after images answered the same "
                "alone and in batches of two make-ups (probe images at load, the run's real "
                "images before its first check)")
    return (f"exported at batch {exported} and run at that batch (one image at a time for 1; "
            f"white-box gradients mapped over images with torch.func.vmap): {why}")


def _probe_input(shape: tuple[int, int, int], layout: str, pre: Preprocessing, n: int,
                 float_input: bool) -> torch.Tensor:
    x = preprocess(probe_images(shape, n), pre, shape[0], layout)
    return x if float_input else x.round().clamp(0, 255).to(torch.uint8)


def load_pt2(path: Path, device: DeviceChoice, preprocessing: Preprocessing | None,
             input_size: tuple[int, int] | None, num_classes: int | None) -> TorchProgramModel:
    """A ``torch.export`` archive, checked by :func:`~certify.models.torchsafety.scan_pt2`
    before torch reads it; identified by the archive's sha256."""
    from certify.models.onnx import sha256_file
    from certify.models.torchsafety import scan_pt2

    scan_pt2(path)
    try:
        with quiet_torch():
            ep = torch.export.load(str(path))
    except Exception as exc:  # noqa: BLE001 - any failure of torch's loader: a bad archive
        raise ModelError(f"torch.export.load cannot read {path.name}: {type(exc).__name__}: "
                         f"{str(exc)[:200]}", hint="save it again with torch.export.save "
                                                   "and this torch version") from None
    return _from_exported(ep, path.name, f"sha256:{sha256_file(path)}", device, preprocessing,
                          input_size, num_classes, "PyTorch exported program (.pt2)")


def _from_exported(ep: Any, name: str, identity: str, device: DeviceChoice,
                   preprocessing: Preprocessing | None, input_size: tuple[int, int] | None,
                   num_classes: int | None, kind: str) -> TorchProgramModel:
    users = [s for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    if len(users) != 1:
        raise ModelError(f"{name} takes {len(users)} inputs",
                         hint="certify needs an image classifier with exactly one image input")
    val = placeholders[users[0].arg.name].meta.get("val")
    if val is None:
        raise ModelError(f"{name} does not state its input's shape", hint="export it again")
    dims: list[int | str] = [int(d) if isinstance(d, int) else str(d) for d in val.shape]
    layout, channels, height, width = image_layout(users[0].arg.name, dims)
    if not isinstance(height, int) or not isinstance(width, int):
        if input_size is None:
            raise ModelError(f"{name}'s input has a symbolic image size {dims}",
                             hint="set preprocessing.input_size: [H, W] in the suite")
        height, width = input_size
    float_input = bool(val.dtype.is_floating_point)
    if device.torch_device.type != "cpu":
        from torch.export.passes import move_to_device_pass

        ep = move_to_device_pass(ep, device.torch_device)
    with quiet_torch():
        gm = ep.module(check_guards=False)
    # the input check torch adds refuses another batch size than the export's, even where the
    # graph takes any: certify feeds the stated image shape and tests the batch itself
    for key, hook in list(gm._forward_pre_hooks.items()):
        if getattr(hook, "__name__", "") == "_check_input_constraints_pre_hook":
            del gm._forward_pre_hooks[key]
    program = FxProgram(gm)
    shape = (channels, int(height), int(width))
    pre = preprocessing or Preprocessing()
    exported = dims[0] if isinstance(dims[0], int) else None
    fixed, note = exported, None
    if exported is not None:
        probe = _probe_input(shape, layout, pre, 6, float_input).to(device.torch_device)
        why = batch_disagreement(program.run, probe) if exported == 1 else \
            f"certify batches only programs exported at batch 1, not {exported}"
        fixed = None if why is None else exported  # exported at one batch, but takes any
        note = _batching_note(exported, why)
    model = TorchProgramModel(program, name=name, identity=identity, input_shape=shape,
                              layout=layout, device=device, preprocessing=preprocessing,
                              num_classes=num_classes, fixed_batch=fixed,
                              float_input=float_input, kind=kind, exported_batch=exported,
                              batching_note=note)
    if exported is not None and fixed is None:  # the batch as exported, and how it runs
        model.info = dataclasses.replace(
            model.info, batch=f"exported at batch {exported} (run batched: the same answers "
                              "alone and in batches)")
    return model


def load_torchscript(path: Path, device: DeviceChoice, preprocessing: Preprocessing | None,
                     input_size: tuple[int, int] | None, num_classes: int | None
                     ) -> TorchProgramModel:
    """A TorchScript file, checked by :func:`~certify.models.torchsafety.scan_torchscript`
    before torch reads it; identified by the file's sha256. A TorchScript file does not state
    its input shape: the suite's ``input_size`` gives it, and the channels (3 or 1) and layout
    (NCHW or NHWC) are the first the program accepts."""
    from certify.models.onnx import sha256_file
    from certify.models.torchsafety import scan_torchscript

    scan_torchscript(path)
    if input_size is None:  # a traced program keeps its example input: its image size
        input_size = _traced_image_size(path)
    if input_size is None:
        raise ModelError(f"{path.name} is a TorchScript program, which does not state its "
                         "input size (and holds no traced example input)",
                         hint="set preprocessing.input_size: [H, W] in the suite")
    try:
        with quiet_torch():
            module = torch.jit.load(str(path), map_location=device.torch_device)
            module.eval()
    except Exception as exc:  # noqa: BLE001 - any failure of torch's loader: a bad file
        # torch.jit.optimize_for_inference on the CPU stores MKLDNN weights that torch.jit.save
        # writes and torch.jit.load cannot read back (torch 2.13: "required keyword attribute
        # 'value' is undefined")
        mkldnn = "required keyword attribute 'value'" in str(exc)
        raise ModelError(f"torch.jit.load cannot read {path.name}: {type(exc).__name__}: "
                         f"{str(exc)[:200]}",
                         hint="a program optimised with torch.jit.optimize_for_inference on "
                              "the CPU cannot be loaded back by torch itself: save "
                              "torch.jit.freeze(torch.jit.script(model)) or the traced "
                              "program instead" if mkldnn else
                              "save it again with this torch version") from None
    return _from_script(module, path.name, f"sha256:{sha256_file(path)}", device,
                        preprocessing, input_size, num_classes, "TorchScript program")


def _traced_image_size(path: Path) -> tuple[int, int] | None:
    """(H, W) of the example input ``torch.jit.trace`` stored in a TorchScript file, where it
    is a batch of images (NCHW or NHWC, 1 or 3 channels)."""
    from certify.models.torchsafety import traced_input_shape

    shape = traced_input_shape(path)
    if shape is None or len(shape) != 4:
        return None
    _layout, _channels, height, width = image_layout("input", list(shape))
    if isinstance(height, int) and isinstance(width, int):
        return height, width
    return None


def _from_script(module: Any, name: str, identity: str, device: DeviceChoice,
                 preprocessing: Preprocessing | None, input_size: tuple[int, int],
                 num_classes: int | None, kind: str) -> TorchProgramModel:
    """A loaded TorchScript module (from a file, or in memory from the Python API) as a
    model: its input convention, batching and cut (see :func:`load_torchscript`)."""
    program = ScriptProgram(module)
    pre = preprocessing or Preprocessing()
    shape, layout = _accepted_shape(program.run, input_size, pre, device, name)
    # a TorchScript program does not state its batch: one image always works (above)
    why = batch_disagreement(program.run, _probe_input(shape, layout, pre, 6, True).to(
        device.torch_device))
    model = TorchProgramModel(program, name=name, identity=identity, input_shape=shape,
                              layout=layout, device=device, preprocessing=preprocessing,
                              num_classes=num_classes, fixed_batch=None if why is None else 1,
                              float_input=True, kind=kind, exported_batch=1,
                              batching_note=_batching_note(1, why).replace(
                                  "exported at batch 1", "saved as TorchScript, which states "
                                  "no batch (one image works)"))
    if program.why_no_cut:  # gradients through an uncut head could be starved: none at all
        model.refuse_white_box(f"certify could not cut the program's graph after its last "
                               f"linear layer ({program.why_no_cut})")
    return model


def _script_digest(module: Any) -> str:
    """``sha256:<hex>`` of a TorchScript module as ``torch.jit.save`` writes it (its code,
    constants and weights): the identity of a scripted, traced or frozen module in memory."""
    buffer = io.BytesIO()
    with quiet_torch():
        torch.jit.save(module, buffer)
    return "sha256:" + hashlib.sha256(buffer.getvalue()).hexdigest()


def _accepted_shape(run: Callable[[torch.Tensor], torch.Tensor], size: tuple[int, int],
                    pre: Preprocessing, device: DeviceChoice, name: str
                    ) -> tuple[tuple[int, int, int], str]:
    """The first input convention (3 or 1 channels, NCHW or NHWC) the program answers for
    one image."""
    tried = []
    for channels in (3, 1):
        for layout in ("NCHW", "NHWC"):
            shape = (channels, *size)
            try:
                with torch.no_grad(), quiet_torch():
                    # one image: a program traced at batch 1 may take no other batch
                    out = run(_probe_input(shape, layout, pre, 1, True).to(device.torch_device))
                if out.shape[0] == 1 and out.dim() in (1, 2):
                    return (channels, int(size[0]), int(size[1])), layout
            except Exception as exc:  # noqa: BLE001 - not this convention
                tried.append(f"{layout} with {channels} channel(s): {str(exc).splitlines()[0][:80]}"
                             if str(exc) else f"{layout}/{channels}: {type(exc).__name__}")
    raise ModelError(f"{name} answers no image batch of size {list(size)} "
                     f"({'; '.join(tried[:2])})",
                     hint="check preprocessing.input_size in the suite")


def from_module(module: torch.nn.Module, device: DeviceChoice,
                preprocessing: Preprocessing | None, input_size: tuple[int, int],
                num_classes: int | None) -> TorchProgramModel:
    """A ``torch.nn.Module`` in memory (the Python API), evaluated in eval mode.

    A TorchScript module (``torch.jit.script``, ``trace``, ``freeze``,
    ``optimize_for_inference``) is run as it is, identified by the sha256 of what
    ``torch.jit.save`` writes of it. Any other module is exported with ``torch.export`` (batch
    dimension dynamic where the module allows)
    and identified by :func:`program_digest` of that program; a module that cannot be exported
    is run as it is (a copy, in eval mode), declared unidentified, its gradient taken at its
    output (the card says both)."""
    if isinstance(module, torch.jit.ScriptModule):  # scripted, traced, frozen: run as saved
        return _from_script(module, module.original_name, _script_digest(module), device,
                            preprocessing, input_size, num_classes,
                            "TorchScript program in memory")
    pre = preprocessing or Preprocessing()
    name = type(module).__name__
    modes = {m: m.training for m in module.modules()}  # given back as they were, each
    where = next((t.device for t in module.parameters()), torch.device("cpu"))
    why = ""
    try:
        module.eval()
        for channels, layout in ((3, "NCHW"), (3, "NHWC"), (1, "NCHW"), (1, "NHWC")):
            shape = (channels, *input_size)
            sample = _probe_input(shape, layout, pre, 2, True).to(where)
            try:
                with torch.no_grad(), quiet_torch():
                    module(sample)
            except Exception as exc:  # noqa: BLE001 - not this convention
                why = f"{type(exc).__name__}: {str(exc)[:200]}"
                continue
            try:
                with quiet_torch():
                    try:
                        ep = torch.export.export(
                            module, (sample,),
                            dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
                    except Exception:  # noqa: BLE001 - a batch the module fixes
                        ep = torch.export.export(module, (sample[:1],))
            except Exception as exc:  # noqa: BLE001 - a module torch.export cannot trace
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                return _unexported(module, name, why, shape, layout, device, preprocessing,
                                   num_classes)
            identity = program_digest(ep)
            return _from_exported(ep, name, identity, device, preprocessing, input_size,
                                  num_classes, "torch.nn.Module in memory (exported with "
                                               "torch.export)")
        raise ModelError(f"the module {name} answers no image batch of size "
                         f"{list(input_size)} ({why})",
                         hint="give images of the size the module takes")
    finally:
        for m, training in modes.items():
            m.training = training


def _unexported(module: torch.nn.Module, name: str, why: str, shape: tuple[int, int, int],
                layout: str, device: DeviceChoice, preprocessing: Preprocessing | None,
                num_classes: int | None) -> TorchProgramModel:
    own = copy.deepcopy(module).eval().to(device.torch_device)
    return TorchProgramModel(
        ModuleProgram(own), name=name,
        identity=f"unidentified: the module could not be exported with torch.export ({why})",
        input_shape=shape, layout=layout, device=device, preprocessing=preprocessing,
        num_classes=num_classes, fixed_batch=None, float_input=True,
        kind="torch.nn.Module in memory (not exportable: run as it is)",
        white_box_note="gradients at the module's output: it could not be exported, so its "
                       "head (if any) could not be cut")


class PredictModel:
    """A black-box model given as an object with ``predict(batch) -> scores``.

    ``predict`` receives float32 ``[N, C, H, W]`` numpy arrays (the images in ``[0, 1]`` after
    the suite's preprocessing) and returns ``[N, K]`` logits or probabilities (``output``
    declares which; ``None``: read off the answers) or ``[N]`` labels, as a numpy array or a
    tensor. Calls are serialised (the object need not be thread-safe). Nothing identifies the
    code behind it: the card says the model is unidentified.
    """

    feature_name: str | None = None

    def __init__(self, obj: Any, input_shape: tuple[int, int, int],
                 preprocessing: Preprocessing | None, output: str | None,
                 num_classes: int | None) -> None:
        if not callable(getattr(obj, "predict", None)):
            raise ModelError(f"{type(obj).__name__} has no predict method",
                             hint="give a path, a URL, a torch.nn.Module or an object with "
                                  "predict(batch) -> scores")
        if output not in (None, "logits", "probs"):
            raise ModelError(f"output={output!r} is not logits or probs",
                             hint="declare output='logits' or output='probs'")
        self.obj = obj
        self.preprocessing = preprocessing or Preprocessing()
        self.input_shape = input_shape
        self._lock = threading.Lock()
        name = type(obj).__name__
        self.num_classes = int(num_classes or 0)
        arr = self._call(probe_images(input_shape))
        require_finite_probe(arr, name)
        kind: OutputKind = output_kind(arr)
        if output is not None and kind != "labels":
            if output == "probs" and kind == "logits":
                raise ModelError(f"{name}.predict was declared to return probabilities, but "
                                 "its rows do not lie in [0, 1] summing to 1",
                                 hint="declare output='logits'")
            kind = output  # type: ignore[assignment]
        k = int(arr.shape[1]) if arr.ndim == 2 else self.num_classes
        if kind == "labels" and not k:
            raise ModelError(f"{name}.predict returns labels but the number of classes is "
                             "unknown", hint="name the classes in the suite")
        self.num_classes = k
        self.info = ModelInfo(
            name=name,
            identity=f"unidentified: a Python object's predict method ({name}); certify cannot "
                     "digest the code and weights behind it",
            input_shape=input_shape, num_classes=k, output=kind, layout="NCHW",
            provider="Python predict()", preprocessing=self.preprocessing,
            metadata={"format": "Python object with predict()"},
            white_box="unavailable: a predict() object gives certify its answers only "
                      "(black-box)")

    def _call(self, x: torch.Tensor) -> np.ndarray:
        arr = np.ascontiguousarray(preprocess(x.detach().cpu(), self.preprocessing,
                                              self.input_shape[0], "NCHW").numpy(),
                                   dtype=np.float32)
        with self._lock:
            out = self.obj.predict(arr)
        if isinstance(out, torch.Tensor):
            out = out.detach().cpu().numpy()
        try:
            res = np.asarray(out)
        except Exception as exc:  # noqa: BLE001 - an answer that is not an array
            raise ModelError(f"predict returned {type(out).__name__}, not an array",
                             hint="return [N, K] scores or [N] labels") from exc
        if res.ndim not in (1, 2) or res.shape[0] != len(arr) or res.dtype.kind not in "fiub":
            raise ModelError(f"predict returned {res.dtype} {list(res.shape)} for {len(arr)} "
                             "images", hint="return [N, K] scores or [N] labels")
        return res

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Scores ``[N, K]`` for images ``x`` ``[N, C, H, W]`` in ``[0, 1]``."""
        out = self._call(x)
        if out.ndim == 1:
            return F.one_hot(torch.from_numpy(out.astype(np.int64)),
                             self.num_classes).float().to(x.device)
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).to(x.device)

    def close(self) -> None:
        """Release the object."""
        self.obj = None
