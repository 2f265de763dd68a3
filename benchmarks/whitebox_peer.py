"""certify's white-box APGD attacks against torchattacks' and ART's, on one network (issue 42).

All three sides attack the same torch network: certify's torch copy of the demo's standard ONNX
model (:class:`certify.models.torchcopy.TorchCopy`, whose ``forward`` returns the last linear
layer's logits with autograd; on this model that is the graph's output). Every side's final
points are then judged the same way, outside the timed part, by onnxruntime on the real ONNX
file: a sample counts as broken only where its point lies in ``[0, 1]`` and in the ε-ball
(float tolerance: 1e-6 absolute in L∞, 1e-5 relative in L2) and the ONNX model's top class is
not the true label.

Samples: signs from :func:`certify.demo.synthetic.generate` (seed 4242, as
benchmarks/attacks.py), taken class by class in turn (image 0 of every class, then image 1 …),
the first ``--samples`` (500) that the ONNX model classifies correctly; the generator gives as
many as asked. Threat models: L∞ ε = 8/255 and L2 ε = 0.5, 100 iterations.

Attacks, the same settings on every side:

- **APGD-CE**: certify ``APGD(restarts=R)``; torchattacks ``APGD(loss="ce", n_restarts=R)``;
  ART ``AutoProjectedGradientDescent(loss_type="cross_entropy", nb_random_init=R,
  eps_step=2ε)``. ``R = --restarts`` (1 by default, for all sides; certify's own default is 2).
- **APGD-T**: targeted DLR against the 9 most likely other classes of the clean logits, one
  run of 100 iterations per target on the still unbroken samples, 1 restart. certify
  ``APGDTargeted(targets=9, restarts=1)``; torchattacks ``APGDT(n_classes=43)`` with
  ``n_target_classes = 9`` set on the instance (3.5.1 derives it as ``n_classes - 1``); ART has
  no APGD-T, so its side is this file's loop over the same 9 targets of
  ``AutoProjectedGradientDescent(targeted=True, loss_type="difference_logits_ratio")``, ART's
  own targeted DLR as its AutoAttack runs it (its DLR is ``-(z_t - z_i)/(z_1 - z_3)``, not
  Croce and Hein's targeted DLR), on the samples the torch copy still classifies correctly.

Each side gets the whole sample set as one batch (ART ``batch_size`` = the sample count).
Seeds: torchattacks ``seed=s``; ART ``np.random.seed(s)`` and ``torch.manual_seed(s)``;
certify per-sample seeds ``100_000 (s + 1) + i``. The timed part is constructing the attack and
running it to its final points (certify's sealed call includes its one onnxruntime judgement
of the batch); wall and process CPU seconds are both recorded, because the machine is shared.
torch runs on one thread for all sides (``torch.set_num_threads(1)``, as certify does on CPU).
For each seed, every attack runs on every side before the next seed starts, the sides' order
rotating with the seed, so load on the machine lands on all sides.

**Its own environment** (torchattacks 3.5.1 pins an old ``requests`` and pulls torchvision,
whose PyPI wheels do not load beside the local torch build; certify comes from this working
tree through ``sys.path``, with only the packages its attack and ONNX modules import)::

    python3 -m venv .venv-bench-wb
    .venv-bench-wb/bin/pip install "torch>=2.6,<2.14" numpy onnxruntime onnx \\
        adversarial-robustness-toolbox packaging scipy scikit-learn \\
        kornia orjson requests pillow pydantic scikit-image pyyaml cryptography
    .venv-bench-wb/bin/pip install --no-deps torchattacks==3.5.1

Run (about an hour for the full run on a 2-core machine)::

    .venv-bench-wb/bin/python benchmarks/whitebox_peer.py [--samples 500] [--seeds 3]
        [--restarts 1] [--attacks apgd_t:linf ...] [--sides certify torchattacks ...]
        [--json results.json] [--quick] [--profile apgd_ce:linf]

The markdown tables go to stdout, progress to stderr; ``--json PATH`` also writes every run's
figures (``-``: JSON to stdout instead of the tables). ``--profile ATTACK:NORM`` runs certify's
side of that attack once under cProfile (seed 0) and prints the top functions to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime
import io
import json
import math
import os
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # certify from this working tree (not installed there)

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

from certify.api import demo_model_path  # noqa: E402
from certify.attacks.apgd import APGD, APGDTargeted  # noqa: E402
from certify.demo.synthetic import generate  # noqa: E402
from certify.device import choose_device  # noqa: E402
from certify.models.onnx import OnnxModel  # noqa: E402

#: (attack, norm, ε) in the tables' order.
CONFIGS: tuple[tuple[str, str, float], ...] = (
    ("apgd_ce", "linf", 8 / 255), ("apgd_t", "linf", 8 / 255),
    ("apgd_ce", "l2", 0.5), ("apgd_t", "l2", 0.5))
SIDES = ("certify", "torchattacks", "art")
ITERATIONS = 100
TARGETS = 9
NUM_CLASSES = 43
DATA_SEED = 4242
#: Ball tolerances when judging: absolute in L∞, relative in L2 (float32 rounding of x + δ).
LINF_ATOL, L2_RTOL = 1e-6, 1e-5

Tensor = torch.Tensor
Runner = Callable[[str, str, float, Tensor, Tensor, int, int], Tensor]


@dataclass
class Setup:
    """What every side shares: the torch copy, certify's ONNX model and the judging session."""

    copy: torch.nn.Module
    model: OnnxModel
    session: ort.InferenceSession
    input_name: str

    def labels(self, x: Tensor) -> np.ndarray:
        """The real ONNX model's top class for ``x`` ``[N, 3, 32, 32]`` in [0, 1] (onnxruntime)."""
        out = self.session.run(None, {self.input_name: x.detach().cpu().numpy()
                                      .astype(np.float32)})[0]
        return np.asarray(out).argmax(1)


def load_setup() -> Setup:
    """The demo's standard model three ways: certify's model, its torch copy, a bare session."""
    path = demo_model_path("standard")
    model = OnnxModel(path, choose_device("cpu"))
    copy = model.torch_copy()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return Setup(copy, model, session, session.get_inputs()[0].name)


def load_samples(setup: Setup, n: int) -> tuple[Tensor, Tensor, int]:
    """The first ``n`` correctly classified signs, the classes in turn: ``(x [n, 3, 32, 32],
    y [n], images generated)``."""
    per_class = math.ceil(n / NUM_CLASSES) + 2
    while True:
        xu8, y = generate(per_class, seed=DATA_SEED)
        # class-major from the generator: reorder to image 0 of every class, then image 1 …
        order = np.lexsort((y, np.tile(np.arange(per_class), NUM_CLASSES)))
        x = torch.from_numpy(xu8[order].transpose(0, 3, 1, 2).copy()).float() / 255
        yt = torch.from_numpy(y[order]).long()
        right = np.flatnonzero(setup.labels(x) == yt.numpy())
        if len(right) >= n:
            keep = torch.from_numpy(right[:n])
            return x[keep].contiguous(), yt[keep].contiguous(), len(x)
        per_class *= 2


# -- the three sides ------------------------------------------------------------------------

def run_certify(setup: Setup, attack: str, norm: str, eps: float, x: Tensor, y: Tensor,
                seed: int, restarts: int) -> Tensor:
    """certify's APGD-CE or APGD-T through its sealed call, judged by its ONNX model."""
    atk = (APGD(epsilon=eps, norm=norm, iterations=ITERATIONS, restarts=restarts)
           if attack == "apgd_ce" else
           APGDTargeted(epsilon=eps, norm=norm, iterations=ITERATIONS, restarts=1,
                        targets=TARGETS))
    seeds = torch.arange(len(x), dtype=torch.long) + 100_000 * (seed + 1)
    out = atk(setup.copy, x, y, seeds, "logits", threat=(norm, eps), judge=setup.model)
    return out.x_adv


def run_torchattacks(setup: Setup, attack: str, norm: str, eps: float, x: Tensor, y: Tensor,
                     seed: int, restarts: int) -> Tensor:
    """torchattacks 3.5.1's APGD (``loss="ce"``) or APGDT on the torch copy."""
    import torchattacks

    tnorm = "Linf" if norm == "linf" else "L2"
    # the copy holds buffers, not parameters, so torchattacks cannot find its device and
    # prints a line about it on stdout: keep stdout for the tables
    with contextlib.redirect_stdout(sys.stderr):
        if attack == "apgd_ce":
            atk: Any = torchattacks.APGD(setup.copy, norm=tnorm, eps=eps, steps=ITERATIONS,
                                         n_restarts=restarts, seed=seed, loss="ce")
        else:
            atk = torchattacks.APGDT(setup.copy, norm=tnorm, eps=eps, steps=ITERATIONS,
                                     n_restarts=1, seed=seed, n_classes=NUM_CLASSES)
            atk.n_target_classes = TARGETS  # 3.5.1 sets n_classes - 1 (42) and no argument
    atk.set_device(torch.device("cpu"))
    adv: Tensor = atk(x, y)
    return adv


def run_art(setup: Setup, attack: str, norm: str, eps: float, x: Tensor, y: Tensor,
            seed: int, restarts: int) -> Tensor:
    """ART's AutoProjectedGradientDescent: cross-entropy, or a loop over the 9 targets of its
    targeted DLR on the samples the copy still classifies correctly."""
    from art.attacks.evasion import AutoProjectedGradientDescent
    from art.estimators.classification import PyTorchClassifier

    np.random.seed(seed)
    torch.manual_seed(seed)
    clf = PyTorchClassifier(model=setup.copy, loss=torch.nn.CrossEntropyLoss(),
                            input_shape=tuple(x.shape[1:]), nb_classes=NUM_CLASSES,
                            clip_values=(0.0, 1.0), device_type="cpu")
    anorm: float = np.inf if norm == "linf" else 2
    xn, yn = x.numpy(), y.numpy()
    if attack == "apgd_ce":
        atk = AutoProjectedGradientDescent(clf, norm=anorm, eps=eps, eps_step=2 * eps,
                                           max_iter=ITERATIONS, targeted=False,
                                           nb_random_init=restarts, batch_size=len(x),
                                           loss_type="cross_entropy", verbose=False)
        return torch.from_numpy(atk.generate(xn, y=yn))
    atk = AutoProjectedGradientDescent(clf, norm=anorm, eps=eps, eps_step=2 * eps,
                                       max_iter=ITERATIONS, targeted=True, nb_random_init=1,
                                       batch_size=len(x), loss_type="difference_logits_ratio",
                                       verbose=False)
    with torch.no_grad():
        ranked = setup.copy(x).clone()
    ranked.scatter_(1, y.view(-1, 1), float("-inf"))
    order = ranked.argsort(dim=1, descending=True)
    adv = x.clone()
    todo = torch.arange(len(x))
    for t in range(TARGETS):
        if not len(todo):
            break
        cand = torch.from_numpy(atk.generate(xn[todo.numpy()],
                                             y=order[todo, t].numpy()))
        with torch.no_grad():
            hit = setup.copy(cand).argmax(1) != y[todo]
        adv[todo[hit]] = cand[hit]
        todo = todo[~hit]
    return adv


RUNNERS: dict[str, Callable[..., Tensor]] = {
    "certify": run_certify, "torchattacks": run_torchattacks, "art": run_art}


# -- judging and timing ---------------------------------------------------------------------

def judge(setup: Setup, adv: Tensor, x: Tensor, y: Tensor, norm: str, eps: float
          ) -> tuple[np.ndarray, int]:
    """(broken ``[N]`` bool, points outside the ball or [0, 1]): the ONNX model's verdict."""
    adv = adv.detach().float().cpu()
    delta = (adv - x).flatten(1)
    valid = ((adv >= 0) & (adv <= 1)).flatten(1).all(dim=1)
    if norm == "linf":
        ok = valid & (delta.abs().amax(dim=1) <= eps + LINF_ATOL)
    else:
        ok = valid & (delta.norm(dim=1) <= eps * (1 + L2_RTOL))
    wrong = setup.labels(adv) != y.numpy()
    okn = ok.numpy()
    return wrong & okn, int((~okn).sum())


def timed_run(setup: Setup, side: str, attack: str, norm: str, eps: float, x: Tensor,
              y: Tensor, seed: int, restarts: int) -> dict[str, Any]:
    """One seeded run of one side: its verdicts and times."""
    w0, c0 = time.perf_counter(), time.process_time()
    adv = RUNNERS[side](setup, attack, norm, eps, x, y, seed, restarts)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    broken, outside = judge(setup, adv, x, y, norm, eps)
    return {"side": side, "attack": attack, "norm": norm, "epsilon": eps, "seed": seed,
            "broken": broken, "outside_ball": outside, "wall_s": wall, "cpu_s": cpu,
            "robust_accuracy": 1.0 - float(broken.mean())}


def profile_certify(setup: Setup, spec: str, x: Tensor, y: Tensor, restarts: int) -> None:
    """certify's side of ``ATTACK:NORM`` once under cProfile (seed 0), top functions to stderr."""
    attack, norm = spec.split(":")
    eps = next(e for a, n, e in CONFIGS if a == attack and n == norm)
    prof = cProfile.Profile()
    w0 = time.perf_counter()
    prof.enable()
    run_certify(setup, attack, norm, eps, x, y, 0, restarts)
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).strip_dirs()
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(30)
    print(f"# cProfile of certify {spec} on {len(x)} samples: "
          f"{time.perf_counter() - w0:.1f} s wall\n{buf.getvalue()}", file=sys.stderr)


# -- tables ---------------------------------------------------------------------------------

def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (attack, norm, side): robust accuracy (mean and per seed) and median times."""
    out = []
    for attack, norm, eps in CONFIGS:
        for side in SIDES:
            rs = [r for r in runs if (r["attack"], r["norm"], r["side"]) == (attack, norm, side)]
            if not rs:
                continue
            out.append({"attack": attack, "norm": norm, "epsilon": eps, "side": side,
                        "robust_accuracy": statistics.fmean(r["robust_accuracy"] for r in rs),
                        "per_seed": [r["robust_accuracy"] for r in rs],
                        "wall_s_median": statistics.median(r["wall_s"] for r in rs),
                        "cpu_s_median": statistics.median(r["cpu_s"] for r in rs),
                        "wall_s": [r["wall_s"] for r in rs],
                        "outside_ball": sum(r["outside_ball"] for r in rs)})
    return out


def compare(runs: list[dict[str, Any]], summary: list[dict[str, Any]]
            ) -> list[dict[str, Any]]:
    """certify against each peer: robust-accuracy gap, ratios, samples only one side broke."""
    rows = []
    by = {(s["attack"], s["norm"], s["side"]): s for s in summary}
    for attack, norm, _ in CONFIGS:
        mine = by.get((attack, norm, "certify"))
        for peer in SIDES[1:]:
            theirs = by.get((attack, norm, peer))
            if mine is None or theirs is None:
                continue
            only_mine, only_theirs = [], []
            for r in runs:
                if (r["attack"], r["norm"], r["side"]) != (attack, norm, "certify"):
                    continue
                p = next(q for q in runs if (q["attack"], q["norm"], q["side"], q["seed"])
                         == (attack, norm, peer, r["seed"]))
                only_mine.append(int((r["broken"] & ~p["broken"]).sum()))
                only_theirs.append(int((p["broken"] & ~r["broken"]).sum()))
            gap = 100 * (mine["robust_accuracy"] - theirs["robust_accuracy"])
            ratio = (mine["robust_accuracy"] / theirs["robust_accuracy"]
                     if theirs["robust_accuracy"] > 0 else None)
            time_ratio = mine["wall_s_median"] / theirs["wall_s_median"]
            rows.append({"attack": attack, "norm": norm, "peer": peer, "gap_points": gap,
                         "robust_accuracy_ratio": ratio, "wall_ratio": time_ratio,
                         "cpu_ratio": mine["cpu_s_median"] / theirs["cpu_s_median"],
                         "broken_only_by_certify": statistics.fmean(only_mine),
                         "broken_only_by_peer": statistics.fmean(only_theirs),
                         "meets_acceptance": gap <= 1.0 + 1e-9 and time_ratio <= 1.0})
    return rows


def _eps(norm: str, eps: float) -> str:
    return f"L∞ {eps * 255:g}/255" if norm == "linf" else f"L2 {eps:g}"


def markdown(summary: list[dict[str, Any]], comparison: list[dict[str, Any]]) -> str:
    """The two tables: per side, and certify against each peer."""
    names = {"apgd_ce": "APGD-CE", "apgd_t": "APGD-T"}
    lines = ["| attack | threat | side | robust accuracy % (mean) | per seed % | "
             "wall s (median) | CPU s (median) | out of ball |",
             "|---|---|---|---:|---|---:|---:|---:|"]
    for s in summary:
        lines.append(f"| {names[s['attack']]} | {_eps(s['norm'], s['epsilon'])} | {s['side']} | "
                     f"{100 * s['robust_accuracy']:.1f} | "
                     f"{' / '.join(f'{100 * a:.1f}' for a in s['per_seed'])} | "
                     f"{s['wall_s_median']:.1f} | {s['cpu_s_median']:.1f} | "
                     f"{s['outside_ball']} |")
    lines += ["", "| attack | threat | peer | certify − peer (points) | robust acc. ratio | "
              "wall ratio | CPU ratio | broken only by certify / peer (mean per seed) | "
              "RA ≤ peer + 1 and wall ≤ peer |",
              "|---|---|---|---:|---:|---:|---:|---|---|"]
    eps_of = {(a, n): e for a, n, e in CONFIGS}
    for c in comparison:
        ratio = "–" if c["robust_accuracy_ratio"] is None else f"{c['robust_accuracy_ratio']:.2f}"
        lines.append(f"| {names[c['attack']]} | {_eps(c['norm'], eps_of[c['attack'], c['norm']])}"
                     f" | {c['peer']} | {c['gap_points']:+.1f} | {ratio} | "
                     f"{c['wall_ratio']:.2f} | {c['cpu_ratio']:.2f} | "
                     f"{c['broken_only_by_certify']:.1f} / {c['broken_only_by_peer']:.1f} | "
                     f"{'yes' if c['meets_acceptance'] else 'no'} |")
    return "\n".join(lines)


def machine_state() -> dict[str, Any]:
    """Time of day, load and versions (the machine is shared)."""
    import art
    import torchattacks

    return {"utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "loadavg": [round(v, 2) for v in os.getloadavg()], "cpus": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "numpy": np.__version__,
            "onnxruntime": ort.__version__, "torchattacks": torchattacks.__version__,
            "art": art.__version__}


def main() -> None:
    """Run every attack on every side for every seed, then print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=500)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--restarts", type=int, default=1, help="APGD-CE restarts on every side")
    ap.add_argument("--quick", action="store_true",
                    help="a tiny run (8 samples, 1 seed, 5 iterations) to check it works")
    ap.add_argument("--attacks", nargs="+", metavar="ATTACK:NORM",
                    default=[f"{a}:{n}" for a, n, _ in CONFIGS],
                    help="run only these, e.g. apgd_t:linf (default: all four)")
    ap.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    ap.add_argument("--json", help="write every run's figures here ('-': stdout)")
    ap.add_argument("--profile", metavar="ATTACK:NORM",
                    help="profile certify's side of e.g. apgd_ce:linf once, then stop")
    args = ap.parse_args()
    global ITERATIONS
    if args.quick:
        args.samples, args.seeds, ITERATIONS = 8, 1, 5
    torch.set_num_threads(1)
    setup = load_setup()
    x, y, generated = load_samples(setup, args.samples)
    with torch.no_grad():
        diff = (setup.copy(x) - torch.from_numpy(setup.session.run(
            None, {setup.input_name: x.numpy()})[0])).abs().max().item()
    print(f"{len(x)} correctly classified samples of {generated} generated; torch copy vs "
          f"onnxruntime logits: max |diff| {diff:.2e}", file=sys.stderr)
    if args.profile:
        profile_certify(setup, args.profile, x, y, args.restarts)
        return
    state = {"start": machine_state()}
    runs: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    chosen = [c for c in CONFIGS if f"{c[0]}:{c[1]}" in args.attacks]
    for seed in range(args.seeds):
        k = seed % len(args.sides)  # who goes first rotates with the seed
        sides = args.sides[k:] + args.sides[:k]
        for attack, norm, eps in chosen:
            for side in sides:
                r = timed_run(setup, side, attack, norm, eps, x, y, seed, args.restarts)
                runs.append(r)
                print(f"seed {seed} {attack} {norm} {side}: robust accuracy "
                      f"{100 * r['robust_accuracy']:.1f}% in {r['wall_s']:.1f} s "
                      f"({r['cpu_s']:.1f} s CPU), {r['outside_ball']} out of ball",
                      file=sys.stderr)
    state["end"] = machine_state()
    state["benchmark_wall_s"] = time.perf_counter() - t_all
    summary = summarise(runs)
    comparison = compare(runs, summary)
    table = markdown(summary, comparison)
    payload = {"samples": len(x), "generated": generated, "data_seed": DATA_SEED,
               "iterations": ITERATIONS, "targets": TARGETS, "restarts_ce": args.restarts,
               "seeds": args.seeds, "copy_vs_onnx_max_abs": diff, "machine": state,
               "summary": summary, "comparison": comparison,
               "runs": [{**r, "broken": [int(i) for i in np.flatnonzero(r["broken"])]}
                        for r in runs]}
    if args.json == "-":
        print(json.dumps(payload, indent=1))
        return
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=1))
    print(f"{len(x)} samples, {args.seeds} seeds, {ITERATIONS} iterations, APGD-CE restarts "
          f"{args.restarts}, APGD-T {TARGETS} targets × 1 restart; "
          f"{state['start']['utc']} → {state['end']['utc']}, load "
          f"{state['start']['loadavg']} → {state['end']['loadavg']}, "
          f"{state['benchmark_wall_s']:.0f} s in all\n")
    print(table)


if __name__ == "__main__":
    main()
