"""The cost of certify's bound propagation: CPU seconds per sample of IBP, CROWN and α-CROWN.

Issue 64's "Cost" acceptance. :class:`certify.models.bound_ops.BoundGraph` on four networks,
at L∞ 2/255 and L2 0.1:

- the demo CNNs ``certify/demo/standard.onnx``, ``robust.onnx`` (the same 5-conv / max-pool /
  2-dense network, 0.21 M parameters) and ``certified.onnx`` (the small IBP-trained CNN: two
  stride-2 convolutions, two dense layers), on the demo's test signs
  (:func:`certify.demo.synthetic.generate` at the demo's seed, the first image of each class,
  the classes in turn), with their true labels;
- ``resnet8``: a ResNet-8 for CIFAR (He et al. 2016, n = 1): a 3×3 stem with 16 channels,
  three residual blocks of 16, 32 and 64 channels (the second and third stride 2, with 1×1
  projection shortcuts), BatchNorm after every convolution, ReLU, global average pooling and a
  dense layer to 10 classes; random weights and BatchNorm statistics (seed 0), eval mode,
  exported here with ``torch.onnx.export(..., dynamo=False, training=PRESERVE)`` so that the
  graph keeps its ``BatchNormalization`` nodes (the default export folds them into the
  convolutions). It takes the same signs; its labels are its own predictions (its certified
  counts mean nothing and are not reported).

Methods, each timed as what it costs on its own:

- ``ibp``: ``bounds(..., methods=("ibp",))`` on all ``--samples`` signs in one call (the
  certified check's IBP takes its whole record batch), repeated until half a second of CPU is
  spent (after one untimed warm-up call);
- ``crown``: the bounds up to CROWN's: IBP, the intermediate CROWN bounds of every ReLU /
  MaxPool input (a tensor over ``max_crown_neurons`` = 4096 values per sample keeps IBP's; one
  read only by ReLUs is refined at its unstable values only, the union over the batch) and the
  final backward pass;
- ``alpha``: α-CROWN, 30 Adam steps (lr 0.1) on the slopes, on top of CROWN's bounds.

CROWN and α-CROWN come from one call, ``bounds(..., methods=("ibp", "crown", "alpha"))``: its
CPU time is α-CROWN's; CROWN's is the same less the time spent in the slope optimisation
(``_Run.optimise``, timed by a wrapper in the worker process). A wrapper around
``_Run.backward`` also times each intermediate bound and counts the values it bounded, for the
per-layer table. CPU seconds are ``time.process_time`` (user and system: CROWN allocates
gigabytes, and the kernel's page faults are a large share) in a worker process per network,
torch on one thread as certify runs on the CPU; the worker also reports its peak resident
memory.

Batches: CROWN and α-CROWN run one sample per call, as the certified check calls them
(:meth:`certify.checks.certified.Certified._bound`); the certified CNN also runs them on
batches of 8 for comparison (the rows refined are the union of the batch's unstable values, so
a batch costs more per sample). CROWN's intermediate bounds of a tensor of ``n`` values hold
``2n`` linear bounds over every earlier tensor: a worker peaked at 3.7 GiB with one sample on
the demo's standard CNN, 7.2 GiB on the ResNet.

``benchmarks/reference_workload.py`` runs first in the same invocation; every figure is also
given as a ratio to its best round.

Run (about 13 minutes on a 2-core machine, 7 with ``--jobs 2``: one sample of CROWN and
α-CROWN costs about 100 s on the standard and robust CNNs and 150 s on the ResNet, per threat
model, so ``--heavy-samples`` sets the time)::

    python benchmarks/bound_cost.py [--samples 8] [--heavy-samples 1] [--jobs 1] [--quick]
        [--models standard robust certified resnet8] [--append benchmarks/RESULTS.md]

``--samples``: signs for IBP on every network and for CROWN / α-CROWN on the certified CNN;
``--heavy-samples``: signs for CROWN / α-CROWN on the standard and robust CNNs and the ResNet.
``--jobs N``: N networks at once, each in its own worker process (CPU seconds are each
worker's own, but workers on the same cores contend for memory bandwidth). ``--quick``: 4
signs, CROWN / α-CROWN on the certified CNN only (IBP everywhere), about a minute. The markdown
table goes to stdout, progress to stderr (then every figure as JSON); ``--append PATH`` also
appends the table, with the command, under the heading "The cost of bound propagation".
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # certify from this working tree

import numpy as np  # noqa: E402
import torch  # noqa: E402

if TYPE_CHECKING:
    from certify.models.bound_ops import BoundGraph

HEADING = "## The cost of bound propagation (`benchmarks/bound_cost.py`)"
#: The threat models: (norm, ε, how the table writes ε).
THREATS: tuple[tuple[str, float, str], ...] = (("linf", 2 / 255, "2/255"), ("l2", 0.1, "0.1"))
ALPHA_STEPS = 30
#: IBP is repeated until this much CPU is spent, for a measurable time.
IBP_MIN_S = 0.5


@dataclass(frozen=True)
class Network:
    """One network: where it comes from, CROWN's batch, and whether its labels are true."""

    name: str
    crown_batches: tuple[int, ...]
    heavy: bool
    true_labels: bool


NETWORKS = {n.name: n for n in (
    Network("standard", (1,), heavy=True, true_labels=True),
    Network("robust", (1,), heavy=True, true_labels=True),
    Network("certified", (1, 8), heavy=False, true_labels=True),
    Network("resnet8", (1,), heavy=True, true_labels=False),
)}
#: The networks, dearest first (the order ``--jobs`` starts them in).
COST_ORDER = ("resnet8", "standard", "robust", "certified")


# -- the networks and the signs -------------------------------------------------------------

def resnet8() -> torch.nn.Module:
    """ResNet-8 for CIFAR (module docstring), random weights and BatchNorm statistics, eval."""
    from torch import nn

    def conv_bn(cin: int, cout: int, k: int, stride: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)]

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(*conv_bn(cin, cout, 3, stride), nn.ReLU(),
                                      *conv_bn(cout, cout, 3, 1))
            self.short = (nn.Sequential() if stride == 1 and cin == cout
                          else nn.Sequential(*conv_bn(cin, cout, 1, stride)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.body(x) + self.short(x))

    class ResNet8(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(*conv_bn(3, 16, 3, 1), nn.ReLU(), Block(16, 16, 1),
                                          Block(16, 32, 2), Block(32, 64, 2),
                                          nn.AdaptiveAvgPool2d(1), nn.Flatten())
            self.fc = nn.Linear(64, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.features(x))

    torch.manual_seed(0)
    net = ResNet8()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                assert m.running_mean is not None and m.running_var is not None
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.uniform_(m.bias, -0.1, 0.1)
                nn.init.uniform_(m.running_mean, -0.1, 0.1)
                nn.init.uniform_(m.running_var, 0.5, 1.5)
    return net.eval()


def network_path(name: str, tmp: Path) -> Path:
    """The ONNX file of ``name``: a demo model's, or the ResNet exported into ``tmp``."""
    if name != "resnet8":
        from certify.api import demo_model_path
        return demo_model_path(name)
    path = tmp / "resnet8.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(resnet8(), (torch.zeros(1, 3, 32, 32),), str(path), dynamo=False,
                          training=torch.onnx.TrainingMode.PRESERVE, input_names=["input"],
                          output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    return path


def signs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` of the demo test set's signs, the classes in turn (index 0 of each class
    first: every image is a pure function of (seed, class, index))."""
    from certify.api import DEMO_SEED
    from certify.demo.synthetic import NUM_CLASSES, generate

    per_class = -(-n // NUM_CLASSES)
    images, labels = generate(per_class, seed=DEMO_SEED)
    order = np.lexsort((labels, np.tile(np.arange(per_class), NUM_CLASSES)))[:n]
    x = images[order].transpose(0, 3, 1, 2).astype(np.float32) / 255
    return torch.from_numpy(x.copy()), torch.from_numpy(labels[order].astype(np.int64))


# -- timing inside the worker ---------------------------------------------------------------

class Clock:
    """CPU seconds spent in ``_Run.optimise`` (α-CROWN's steps) and, per target tensor, in
    each intermediate ``_Run.backward`` with the rows it bounded, while :meth:`wrapped` is
    active."""

    def __init__(self) -> None:
        self.optimise = 0.0
        self.layers: dict[str, dict[str, float]] = {}

    @contextmanager
    def wrapped(self) -> Iterator[None]:
        from certify.models import bound_ops

        run = bound_ops._Run  # noqa: SLF001 - the benchmark times the engine's phases
        optimise, backward = run.optimise, run.backward

        def timed_optimise(inner: Any, *args: Any, **kw: Any) -> torch.Tensor:
            t0 = time.process_time()
            try:
                return optimise(inner, *args, **kw)
            finally:
                self.optimise += time.process_time() - t0

        def timed_backward(inner: Any, target: str, c: torch.Tensor,
                           intermediate: bool = False) -> torch.Tensor:
            t0 = time.process_time()
            try:
                return backward(inner, target, c, intermediate)
            finally:
                if intermediate:
                    got = self.layers.setdefault(target, {"s": 0.0, "rows": 0.0})
                    got["s"] += time.process_time() - t0
                    got["rows"] += c.shape[1] // 2  # a lower and an upper row per value

        run.optimise = timed_optimise  # type: ignore[method-assign, assignment]
        run.backward = timed_backward  # type: ignore[method-assign, assignment]
        try:
            yield
        finally:
            run.optimise = optimise  # type: ignore[method-assign]
            run.backward = backward  # type: ignore[method-assign]


def cpu(call: Callable[[], Any]) -> tuple[Any, float]:
    """``call()``'s value and its CPU seconds."""
    t0 = time.process_time()
    out = call()
    return out, time.process_time() - t0


def layer_plan(graph: BoundGraph, x: torch.Tensor) -> list[dict[str, Any]]:
    """Every nonlinear node's input tensor: its name, the operators that read it, neurons per
    sample, and how CROWN bounds it: ``IBP`` (over ``max_crown_neurons``: keeps IBP's),
    ``CROWN`` (every value) or ``CROWN, unstable`` (only ReLUs read it: the values whose
    interval crosses zero)."""
    from certify.models.bound_ops import NONLINEAR

    env = graph.concrete(x[:1])
    readers: dict[str, list[str]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            readers.setdefault(i, []).append(n.op_type)
    out: list[dict[str, Any]] = []
    for n in graph.nodes:
        t = n.inputs[0]
        if n.op_type in NONLINEAR and t in graph.variable and all(p["tensor"] != t for p in out):
            neurons = int(env[t][0].numel())
            relu_only = all(r in ("Relu", "LeakyRelu") for r in readers[t])
            how = ("IBP" if neurons > graph.max_crown_neurons
                   else "CROWN, unstable" if relu_only else "CROWN")
            out.append({"tensor": t, "op": "/".join(sorted(set(readers[t]))),
                        "neurons": neurons, "bound": how})
    return out


def ibp_row(graph: BoundGraph, x: torch.Tensor, y: torch.Tensor, norm: str, eps: float
            ) -> tuple[float, torch.Tensor]:
    """IBP's CPU seconds per sample on the batch ``x`` (repeated for at least
    :data:`IBP_MIN_S`) and its margins."""
    spent, calls = 0.0, 0
    margins = torch.empty(0)
    while spent < IBP_MIN_S or calls == 0:
        res, s = cpu(partial(graph.bounds, x, y, norm, eps, methods=("ibp",)))
        spent, calls, margins = spent + s, calls + 1, res.margins["ibp"]
    return spent / calls / len(x), margins


def worker(name: str, samples: int, heavy_samples: int, crown: bool) -> dict[str, Any]:
    """Every threat model and method on one network; the figures as a dict."""
    from certify.models.bound_ops import TOLERANCE, BoundGraph, certified

    torch.set_num_threads(1)
    net = NETWORKS[name]
    with tempfile.TemporaryDirectory() as tmp:
        graph = BoundGraph(network_path(name, Path(tmp)))
    n_crown = (heavy_samples if net.heavy else samples) if crown else 0
    x, y = signs(max(samples, n_crown))
    if not net.true_labels:
        with torch.no_grad():
            y = graph.logits(x).argmax(1)
    graph.bounds(x[:1], y[:1], "linf", THREATS[0][1], methods=("ibp",))  # warm-up, untimed
    rows: list[dict[str, Any]] = []
    layers: dict[str, dict[str, dict[str, float]]] = {}
    for norm, eps, label in THREATS:
        base = {"network": name, "norm": norm, "eps": label}
        s, margins = ibp_row(graph, x[:samples], y[:samples], norm, eps)
        rows.append({**base, "method": "ibp", "batch": samples, "samples": samples,
                     "s_per_sample": s, "certified": int((margins > TOLERANCE).sum())
                     if net.true_labels else None})
        print(f"{name} {norm} IBP: {s:.4f} s/sample", file=sys.stderr)
        for batch in net.crown_batches if n_crown else ():
            clock = Clock()
            total, found = 0.0, {"ibp": 0, "crown": 0, "alpha": 0}
            with clock.wrapped():
                for at in range(0, n_crown, batch):
                    xb, yb = x[at:at + batch], y[at:at + batch]
                    res, s = cpu(partial(graph.bounds, xb, yb, norm, eps,
                                         methods=("ibp", "crown", "alpha"),
                                         alpha_steps=ALPHA_STEPS))
                    total += s
                    for m, ok in certified(res.margins).items():
                        found[m] += int(ok.sum())
                    print(f"{name} {norm} CROWN + α-CROWN, {len(xb)} sample(s): {s:.1f} s",
                          file=sys.stderr)
            for method, seconds in (("crown", total - clock.optimise), ("alpha", total)):
                rows.append({**base, "method": method, "batch": min(batch, n_crown),
                             "samples": n_crown, "s_per_sample": seconds / n_crown,
                             "certified": found[method] if net.true_labels else None})
            if batch == net.crown_batches[0]:
                layers[norm] = {t: {"s": v["s"] / n_crown, "rows": v["rows"] * batch / n_crown}
                                for t, v in clock.layers.items()}
    return {"network": name, "rows": rows, "plan": layer_plan(graph, x), "layers": layers,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


# -- the driver -----------------------------------------------------------------------------

def reference_workload() -> float:
    """``benchmarks/reference_workload.py``'s best round, seconds, run now."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "reference_workload.py")],
                         capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["best_s"])


def run_worker(name: str, samples: int, heavy_samples: int, crown: bool) -> dict[str, Any]:
    """:func:`worker` in a fresh process (its own peak memory; the memory back after it)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, __file__, "--worker", name, "--samples", str(samples),
                          "--heavy-samples", str(heavy_samples),
                          *([] if crown else ["--no-crown"])],
                         stdout=subprocess.PIPE, text=True, check=True, env=env)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def markdown(results: list[dict[str, Any]], ref: float) -> str:
    """The cost table, then CROWN's intermediate bounds per layer."""
    names = {"ibp": "IBP", "crown": "CROWN", "alpha": f"α-CROWN ({ALPHA_STEPS} steps)"}
    lines = ["| network | norm | ε | method | batch | samples | CPU s / sample | "
             "/ reference | certified | peak RSS GiB |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        for row in r["rows"]:
            cert = "—" if row["certified"] is None else f"{row['certified']} / {row['samples']}"
            lines.append(
                f"| {row['network']} | {row['norm']} | {row['eps']} | {names[row['method']]} | "
                f"{row['batch']} | {row['samples']} | {row['s_per_sample']:.3g} | "
                f"{row['s_per_sample'] / ref:.3g} | {cert} | {r['peak_rss_gib']:.1f} |")
    lines += ["", "CROWN's intermediate bounds, one sample per call (per sample: CPU s, and the "
              "values bounded, each by a lower and an upper row):", "",
              "| network | tensor | read by | neurons / sample | bounds | L∞ s | L∞ values | "
              "L2 s | L2 values |", "|---|---|---|---:|---|---:|---:|---:|---:|"]
    for r in results:
        for p in r["plan"]:
            cells = []
            for norm in ("linf", "l2"):
                got = r["layers"].get(norm, {}).get(p["tensor"])
                cells += (["—", "—"] if got is None
                          else [f"{got['s']:.3g}", f"{got['rows']:.0f}"])
            lines.append(f"| {r['network']} | `{p['tensor']}` | {p['op']} | {p['neurons']} | "
                         f"{p['bound']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    """The reference workload, then a worker per network; the table to stdout."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--heavy-samples", type=int, default=1)
    ap.add_argument("--models", nargs="+", choices=sorted(NETWORKS), default=list(NETWORKS))
    ap.add_argument("--jobs", type=int, default=1,
                    help="networks measured at once, each in its own process (default 1)")
    ap.add_argument("--quick", action="store_true",
                    help="4 signs; CROWN and α-CROWN on the certified CNN only")
    ap.add_argument("--append", metavar="PATH", help="append the table to this markdown file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--no-crown", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.samples, args.heavy_samples,
                                not args.no_crown)))
        return
    if args.quick:
        args.samples = min(args.samples, 4)
    start = datetime.datetime.now(datetime.timezone.utc)
    load0 = os.getloadavg()
    ref = reference_workload()
    print(f"reference workload: {ref:.2f} s", file=sys.stderr)
    # the dearest first, so that parallel workers finish together
    order = sorted(args.models, key=lambda n: (COST_ORDER.index(n), n))
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {name: pool.submit(run_worker, name, args.samples, args.heavy_samples,
                                     not (args.quick and NETWORKS[name].heavy))
                   for name in order}
        results = [futures[name].result() for name in args.models]
    end = datetime.datetime.now(datetime.timezone.utc)
    table = markdown(results, ref)
    command = "python benchmarks/bound_cost.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    head = (f"{start:%Y-%m-%d %H:%M}–{end:%H:%M} UTC, {(end - start).total_seconds():.0f} s "
            f"wall ({args.jobs} worker(s) at once), load {load0[0]:.1f} → "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, torch {torch.__version__}; reference "
            f"workload {ref:.2f} s (best of 3).")
    print(head + "\n\n" + table)
    print(json.dumps({"reference_workload_s": ref, "results": results}), file=sys.stderr)
    if args.append:
        with open(args.append, "a", encoding="utf-8") as fh:
            fh.write(f"\n{HEADING}\n\n    {command.strip()}\n\n{head}\n\n{table}\n")


if __name__ == "__main__":
    main()
