"""certify's APGD-L1 (l1-APGD) against two peer L1 APGDs at the same budget, on the demo model.

certify: ``APGD(norm="l1")`` (apgd_ce: cross-entropy, sparse steps, the exact projection onto
the L1 ball and the box; Croce & Hein 2021) through its sealed call on the torch copy of
``certify/demo/standard.onnx`` (:meth:`certify.models.onnx.OnnxModel.torch_copy`), judged by
the ONNX model. Peers, on the same torch copy:

- ART 1.20.1's ``AutoProjectedGradientDescent(norm=1, loss_type="cross_entropy",
  eps_step=2ε)`` (``PyTorchClassifier``, ``clip_values=(0, 1)``): APGD with dense L1 steps
  (the gradient over its L1 norm) and a rescaling onto the ball;
- AutoAttack's own ``APGDAttack(norm="L1", loss="ce")``, Croce and Hein's reference code, as
  PyPI's ``pyautoattack`` 0.2.0 packages it (its ``autopgd_base.py`` is fra31/auto-attack's).

Same budget: ``--iterations`` (100) gradient steps × ``--restarts`` (1) runs per sample on
every side (certify and AutoAttack also spend one gradient evaluation at each start; ART a
forward pass per step for its loss).

Samples: the first ``--samples`` (100) signs of :func:`certify.demo.synthetic.generate` (seed
4242, the classes in turn) that the ONNX model classifies correctly. Radii: ``--eps`` (3, 6
and 12; L1 in [0, 1] pixel units over the 3×32×32 values). Every point either side returns is
re-checked here, apart from both attacks' code: a break is a point with ``Σ|x' − x| ≤ ε (1 +
1e-5)`` (float64), every value in [0, 1], and a top class of a fresh onnxruntime session on
the ONNX file other than the label. CPU seconds are the process CPU time of constructing and
running each attack (torch on one thread on every side).

**The peers' environment.** Each peer runs in a subprocess of this interpreter with
``benchmarks/.peer-site`` first on its path: the script installs them there when missing
(``pip install --no-deps --target benchmarks/.peer-site adversarial-robustness-toolbox==1.20.1
pyautoattack==0.2.0``, about 1.2 MB); their runtime dependencies (torch, numpy, scipy,
scikit-learn, six, setuptools, tqdm) are certify's own environment's. The subprocess rebuilds
the torch copy from the ONNX file with certify's converter, so every side differentiates the
same network.

Run (about 2 minutes per seed on a 2-core machine)::

    python benchmarks/apgd_l1.py [--samples 100] [--eps 3 6 12] [--seeds 1] [--restarts 1]
        [--append benchmarks/RESULTS.md]

The markdown table goes to stdout, progress to stderr; ``--append PATH`` also appends it, with
the command, under the heading "APGD-L1 against a peer L1 attack".
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # certify from this working tree

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

from certify.api import demo_model_path  # noqa: E402

PEER_SITE = ROOT / "benchmarks" / ".peer-site"
PEERS = {"art": ("art", "adversarial-robustness-toolbox==1.20.1"),
         "autoattack": ("pyautoattack", "pyautoattack==0.2.0")}
NUM_CLASSES = 43
DATA_SEED = 4242
#: The re-check's tolerance on the L1 radius (float32 rounding of x + δ).
L1_RTOL = 1e-5
HEADING = "## APGD-L1 against a peer L1 attack (`benchmarks/apgd_l1.py`)"


# -- the peer, in its own process -----------------------------------------------------------

def ensure_peers() -> None:
    """Install the peers into :data:`PEER_SITE` (no dependencies) unless they are there."""
    missing = [spec for module, spec in PEERS.values()
               if not (PEER_SITE / module / "__init__.py").exists()]
    if not missing:
        return
    print(f"installing {' '.join(missing)} into {PEER_SITE}", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(PEER_SITE), *missing], check=True)


def _art(copy: torch.nn.Module, x: np.ndarray, y: np.ndarray, eps: float, seed: int,
         iterations: int, restarts: int) -> tuple[np.ndarray, str]:
    import art
    from art.attacks.evasion import AutoProjectedGradientDescent
    from art.estimators.classification import PyTorchClassifier

    np.random.seed(seed)
    torch.manual_seed(seed)
    clf = PyTorchClassifier(model=copy, loss=torch.nn.CrossEntropyLoss(),
                            input_shape=tuple(x.shape[1:]), nb_classes=NUM_CLASSES,
                            clip_values=(0.0, 1.0), device_type="cpu")
    atk = AutoProjectedGradientDescent(clf, norm=1, eps=eps, eps_step=2 * eps,
                                       max_iter=iterations, targeted=False,
                                       nb_random_init=restarts, batch_size=len(x),
                                       loss_type="cross_entropy", verbose=False)
    return atk.generate(x, y=y), f"ART {art.__version__} APGD norm=1"


def _autoattack(copy: torch.nn.Module, x: np.ndarray, y: np.ndarray, eps: float, seed: int,
                iterations: int, restarts: int) -> tuple[np.ndarray, str]:
    import pyautoattack
    from pyautoattack.autopgd_base import APGDAttack

    atk = APGDAttack(copy, norm="L1", eps=eps, n_iter=iterations, n_restarts=restarts,
                     seed=seed, loss="ce", device=torch.device("cpu"))
    adv = atk.perturb(torch.from_numpy(x), torch.from_numpy(y))
    return adv.detach().numpy(), f"AutoAttack APGD-L1 (pyautoattack {pyautoattack.__version__})"


def peer_job(path: Path) -> None:
    """The subprocess: a peer's L1 APGD on the job in ``path`` (an npz), answered beside it."""
    from certify.device import choose_device
    from certify.models.onnx import OnnxModel

    torch.set_num_threads(1)
    job = np.load(path)
    copy = OnnxModel(demo_model_path("standard"), choose_device("cpu")).torch_copy()
    run = {"art": _art, "autoattack": _autoattack}[str(job["peer"])]
    c0, w0 = time.process_time(), time.perf_counter()
    adv, name = run(copy, job["x"], job["y"], float(job["eps"]), int(job["seed"]),
                    int(job["iterations"]), int(job["restarts"]))
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    np.savez(path.with_suffix(".out.npz"), adv=adv.astype(np.float32), cpu=cpu, wall=wall,
             name=name)


def run_peer(peer: str, x: torch.Tensor, y: torch.Tensor, eps: float, seed: int,
             iterations: int, restarts: int) -> tuple[np.ndarray, float, float, str]:
    """(the peer's points, CPU s, wall s, its name) from the subprocess."""
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.npz"
        np.savez(job, peer=peer, x=x.numpy(), y=y.numpy(), eps=eps, seed=seed,
                 iterations=iterations, restarts=restarts)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PEER_SITE), str(ROOT)]),
                   OMP_NUM_THREADS="1")
        subprocess.run([sys.executable, __file__, "--peer-job", str(job)], check=True, env=env)
        out = np.load(job.with_suffix(".out.npz"))
        return out["adv"], float(out["cpu"]), float(out["wall"]), str(out["name"])


# -- certify's side and the re-check --------------------------------------------------------

def run_certify(x: torch.Tensor, y: torch.Tensor, eps: float, seed: int, iterations: int,
                restarts: int) -> tuple[np.ndarray, np.ndarray, float, float, int]:
    """(certify's judged points, its own success flags, CPU s, wall s, gradient evaluations
    per sample, the largest)."""
    from certify.attacks.apgd import APGD
    from certify.device import choose_device
    from certify.models.onnx import OnnxModel

    model = OnnxModel(demo_model_path("standard"), choose_device("cpu"))
    copy = model.torch_copy()
    seeds = torch.arange(len(x), dtype=torch.long) + 100_000 * (seed + 1)
    c0, w0 = time.process_time(), time.perf_counter()
    out = APGD(epsilon=eps, norm="l1", iterations=iterations, restarts=restarts)(
        copy, x, y, seeds, "logits", threat=("l1", eps), judge=model)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    return (out.x_adv.numpy(), out.success.numpy(), cpu, wall,
            int(out.gradients.max()))


class Recheck:
    """The independent check: float64 L1 radius, the box, a fresh onnxruntime session."""

    def __init__(self) -> None:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(demo_model_path("standard")), opts,
                                            providers=["CPUExecutionProvider"])
        self.name = self.session.get_inputs()[0].name

    def labels(self, x: np.ndarray) -> np.ndarray:
        """The ONNX model's top class per image."""
        return np.asarray(self.session.run(None, {self.name: x.astype(np.float32)})[0]).argmax(1)

    def __call__(self, adv: np.ndarray, x: np.ndarray, y: np.ndarray, eps: float
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(broken ``[N]``: inside and misclassified, inside ``[N]``: ball and box)."""
        size = np.abs(adv.astype(np.float64) - x.astype(np.float64)).reshape(len(x), -1).sum(1)
        box = ((adv >= 0) & (adv <= 1)).reshape(len(x), -1).all(1)
        inside = box & (size <= eps * (1 + L1_RTOL))
        return inside & (self.labels(adv) != y), inside


def load_samples(recheck: Recheck, n: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The first ``n`` correctly classified signs, the classes in turn."""
    from certify.demo.synthetic import generate

    per_class = math.ceil(n / NUM_CLASSES) + 2
    while True:
        xu8, y = generate(per_class, seed=DATA_SEED)
        order = np.lexsort((y, np.tile(np.arange(per_class), NUM_CLASSES)))
        x = xu8[order].transpose(0, 3, 1, 2).astype(np.float32) / 255
        y = y[order].astype(np.int64)
        right = np.flatnonzero(recheck.labels(x) == y)
        if len(right) >= n:
            keep = right[:n]
            return torch.from_numpy(x[keep].copy()), torch.from_numpy(y[keep].copy()), len(x)
        per_class *= 2


# -- the table --------------------------------------------------------------------------------

def markdown(rows: list[dict[str, Any]]) -> str:
    """One line per (ε, side), then the acceptance per ε."""
    lines = ["| ε (L1) | side | broken (re-checked) | of | certify's own count | outside ball "
             "or box | median changed values of a break | CPU s | wall s |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['eps']:g} | {r['side']} | {r['broken']} | {r['n']} | "
                     f"{r.get('claimed', '—')} | {r['outside']} | {r['l0']} | "
                     f"{r['cpu']:.1f} | {r['wall']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    """Both sides at every ε and seed, re-checked; the table to stdout."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--eps", type=float, nargs="+", default=[3.0, 6.0, 12.0])
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--restarts", type=int, default=1)
    ap.add_argument("--peers", nargs="+", choices=sorted(PEERS), default=["art", "autoattack"])
    ap.add_argument("--append", metavar="PATH", help="append the table to this markdown file")
    ap.add_argument("--peer-job", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer_job:
        peer_job(Path(args.peer_job))
        return
    torch.set_num_threads(1)
    ensure_peers()
    recheck = Recheck()
    x, y, generated = load_samples(recheck, args.samples)
    xn, yn = x.numpy(), y.numpy()
    start = datetime.datetime.now(datetime.UTC)
    load0 = os.getloadavg()
    rows: list[dict[str, Any]] = []
    verdicts: list[str] = []
    for eps in args.eps:
        counts: dict[str, list[int]] = {side: [] for side in ("certify", *args.peers)}
        names: dict[str, str] = {"certify": "certify"}
        for seed in range(args.seeds):
            adv, success, cpu, wall, grads = run_certify(x, y, eps, seed, args.iterations,
                                                         args.restarts)
            broken, inside = recheck(adv, xn, yn, eps)
            changed = (adv != xn).reshape(len(xn), -1).sum(1)[broken]
            rows.append({"eps": eps, "side": f"certify APGD-L1 (seed {seed})",
                         "broken": int(broken.sum()), "n": len(xn),
                         "claimed": int(success.sum()), "outside": int((~inside).sum()),
                         "l0": int(np.median(changed)) if len(changed) else "—",
                         "cpu": cpu, "wall": wall, "grads": grads,
                         "unverified": int((success & ~broken).sum())})
            counts["certify"].append(int(broken.sum()))
            print(f"ε {eps:g} seed {seed} certify: {int(broken.sum())} broken "
                  f"({int(success.sum())} by its own count), {cpu:.1f} s CPU", file=sys.stderr)
            for peer in args.peers:
                padv, pcpu, pwall, names[peer] = run_peer(peer, x, y, eps, seed,
                                                          args.iterations, args.restarts)
                pbroken, pinside = recheck(padv, xn, yn, eps)
                pchanged = (padv != xn).reshape(len(xn), -1).sum(1)[pbroken]
                rows.append({"eps": eps, "side": f"{names[peer]} (seed {seed})",
                             "broken": int(pbroken.sum()), "n": len(xn),
                             "outside": int((~pinside).sum()),
                             "l0": int(np.median(pchanged)) if len(pchanged) else "—",
                             "cpu": pcpu, "wall": pwall})
                counts[peer].append(int(pbroken.sum()))
                print(f"ε {eps:g} seed {seed} {peer}: {int(pbroken.sum())} broken, "
                      f"{int((~pinside).sum())} outside, {pcpu:.1f} s CPU", file=sys.stderr)
        mine = counts["certify"]
        clean = all(r["outside"] == 0 and r["unverified"] == 0 for r in rows
                    if r["eps"] == eps and "unverified" in r)
        for peer in args.peers:
            ok = clean and all(m >= p - 2 for m, p in zip(mine, counts[peer], strict=True))
            verdicts.append(
                f"ε = {eps:g}: certify {'/'.join(map(str, mine))}, {names[peer]} "
                f"{'/'.join(map(str, counts[peer]))} broken of {len(xn)}; certify ≥ peer − 2 "
                f"and every certify break inside the ball and the box: "
                f"**{'yes' if ok else 'no'}**")
    end = datetime.datetime.now(datetime.UTC)
    table = markdown(rows)
    command = "python benchmarks/apgd_l1.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    head = (f"{len(xn)} correctly classified signs of {generated} generated (seed "
            f"{DATA_SEED}), {args.iterations} iterations × {args.restarts} restart(s) on every "
            f"side (certify: {rows[0]['grads']} gradient evaluations per sample at most); "
            f"{start:%Y-%m-%d %H:%M}–{end:%H:%M} UTC, load {load0[0]:.1f} → "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, torch {torch.__version__}.")
    text = "\n\n".join([head, table, "\n".join(f"- {v}" for v in verdicts)])
    print(text)
    if args.append:
        with open(args.append, "a", encoding="utf-8") as f:
            f.write(f"\n{HEADING}\n\n    {command.strip()}\n\n{text}\n")


if __name__ == "__main__":
    main()
