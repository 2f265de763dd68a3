"""Train a small CNN with interval bound propagation (IBP) on the demo's signs (issue 64).

The network is the small IBP CNN of Gowal et al. (2018) and CROWN-IBP (Zhang et al. 2020):
Conv 3→16 k4 s2, ReLU, Conv 16→32 k4 s2, ReLU, Flatten, Linear 2048→H, ReLU, Linear H→43
(only Conv, Relu, Flatten and Gemm in the ONNX graph). It takes ``[N, 3, 32, 32]`` RGB images in
``[0, 1]`` and returns 43 GTSRB logits, like ``certify/demo/standard.onnx``.

Training (Gowal et al. 2018, "On the effectiveness of interval bound propagation"): a warm-up
of natural training, then the L∞ radius ε ramped linearly from 0 to ``--eps-train`` while κ goes
from 1 to 0.5, then both held; the loss is ``κ·CE(z, y) + (1−κ)·CE(ẑ, y)`` where
``ẑ_j = −lower(z_y − z_j)`` are the worst-case logits under IBP (the last layer folded into the
specification ``z_y − z_j``, Gowal et al.'s "elision", which is tighter than bounding the
logits and subtracting). The ε-box is intersected with ``[0, 1]``. IBP is written here in plain
torch (:func:`ibp_margins`); nothing in certify's engine is used.

Evaluation on the demo's test set (``generate(DEMO_PER_CLASS, seed=DEMO_SEED)``, 430 signs):
clean accuracy, IBP-certified accuracy at 1/255 and 2/255 (a sign counts only if
``lower(z_y − z_j) > 0`` for every ``j ≠ y``), and accuracy under a plain-torch L∞ PGD at 2/255
(cross-entropy, 50 steps of 0.5/255, one uniform random start). A certified sign broken by PGD
would be a bug in the bounds or the attack: the script asserts there is none.

Data: training ``generate(--train-per-class, seed=1)``, validation ``generate(30, seed=2)``
(neither is the demo's seed, 20_240_607). The run is deterministic on CPU (one thread, fixed
seeds, ``torch.use_deterministic_algorithms``).

Writes ``certify/demo/certified.onnx`` (opset 17, dynamic batch, input ``input``, output
``logits``), checks onnxruntime against torch, and records the figures under
``models.certified`` in ``certify/demo/figures.json`` (other entries kept).

Run from the repository root::

    .venv/bin/python benchmarks/train_certified.py [--out certify/demo] [--no-export]

The defaults are the shipped fixture's options.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import resource
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F  # noqa: N812
import torch.utils.deterministic
from torch import nn

from certify.api import DEMO_PER_CLASS, DEMO_SEED
from certify.demo.synthetic import NUM_CLASSES, generate

TRAIN_SEED = 1
VAL_SEED = 2
VAL_PER_CLASS = 30
BATCH = 128
EVAL_BATCH = 500
PGD_STEPS = 50
PGD_STEP = 0.5 / 255


def log(msg: str) -> None:
    """Print a progress line immediately."""
    print(msg, flush=True)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def build_model(hidden: int, arch: str = "small") -> nn.Sequential:
    """The small IBP CNN (Gowal et al. 2018's "small", ``hidden`` units in the FC layer).

    ``arch="deep"``: three stride-2 convolutions (32, 64, 64 channels) down to 4×4 before the FC
    layer, for about the same number of parameters.
    """
    if arch == "deep":
        return nn.Sequential(
            nn.Conv2d(3, 32, 4, stride=2, padding=1),  # 16x16
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2, padding=1),  # 8x8
            nn.ReLU(),
            nn.Conv2d(64, 64, 4, stride=2, padding=1),  # 4x4
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * 4 * 4, hidden),
            nn.ReLU(),
            nn.Linear(hidden, NUM_CLASSES),
        )
    return nn.Sequential(
        nn.Conv2d(3, 16, 4, stride=2, padding=1),  # 16x16
        nn.ReLU(),
        nn.Conv2d(16, 32, 4, stride=2, padding=1),  # 8x8
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, hidden),
        nn.ReLU(),
        nn.Linear(hidden, NUM_CLASSES),
    )


def to_tensor(x: np.ndarray) -> torch.Tensor:
    """uint8 NHWC images to a contiguous float32 NCHW tensor in ``[0, 1]``."""
    return torch.from_numpy(x).permute(0, 3, 1, 2).float().div_(255.0).contiguous()


def ibp_margins(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, eps: float) -> torch.Tensor:
    """IBP lower bounds of ``z_y − z_j`` over the L∞ ε-box around ``x`` intersected with [0, 1].

    Interval arithmetic in centre/radius form layer by layer (a linear map sends radius ``r`` to
    ``|W| r``; ReLU is monotone), with the last linear layer folded into the margin
    specification. Returns ``[N, K]``; column ``y`` is 0. Certified iff every other column > 0.
    """
    lo = (x - eps).clamp(0.0, 1.0)
    hi = (x + eps).clamp(0.0, 1.0)
    layers = list(model)
    last = layers[-1]
    assert isinstance(last, nn.Linear)
    for layer in layers[:-1]:
        if isinstance(layer, nn.Conv2d | nn.Linear):
            c, r = (hi + lo) / 2, (hi - lo) / 2
            c = layer(c)
            if isinstance(layer, nn.Conv2d):
                r = F.conv2d(r, layer.weight.abs(), None, layer.stride, layer.padding)
            else:
                r = F.linear(r, layer.weight.abs())
            lo, hi = c - r, c + r
        elif isinstance(layer, nn.ReLU):
            lo, hi = F.relu(lo), F.relu(hi)
        elif isinstance(layer, nn.Flatten):
            lo, hi = layer(lo), layer(hi)
        else:
            raise TypeError(f"no IBP rule for {type(layer).__name__}")
    w, b = last.weight, last.bias
    cw = w[y].unsqueeze(1) - w.unsqueeze(0)  # [N, K, H]: rows w_y − w_j
    cb = b[y].unsqueeze(1) - b.unsqueeze(0)  # [N, K]
    c, r = (hi + lo) / 2, (hi - lo) / 2
    return (
        torch.einsum("nkh,nh->nk", cw, c) + cb - torch.einsum("nkh,nh->nk", cw.abs(), r)
    )


def certified_mask(
    model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, eps: float
) -> torch.Tensor:
    """Boolean ``[N]``: IBP proves the label ``y`` for every input in the ε-box."""
    out = []
    with torch.no_grad():
        for i in range(0, len(x), EVAL_BATCH):
            xb, yb = x[i : i + EVAL_BATCH], y[i : i + EVAL_BATCH]
            m = ibp_margins(model, xb, yb, eps)
            m[torch.arange(len(yb)), yb] = math.inf
            out.append(m.min(1).values > 0)
    return torch.cat(out)


def pgd_correct(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, gen: torch.Generator
) -> torch.Tensor:
    """Boolean ``[N]``: still correct after L∞ PGD (CE, 50 × 0.5/255, one random start).

    A sign counts as broken if any iterate (not only the last) is misclassified.
    """
    for p in model.parameters():
        p.requires_grad_(False)
    out = []
    for i in range(0, len(x), EVAL_BATCH):
        xb, yb = x[i : i + EVAL_BATCH], y[i : i + EVAL_BATCH]
        ok = torch.ones(len(yb), dtype=torch.bool)
        xa = (xb + torch.empty_like(xb).uniform_(-eps, eps, generator=gen)).clamp(0.0, 1.0)
        for _ in range(PGD_STEPS):
            xa.requires_grad_(True)
            logits = model(xa)
            ok &= logits.detach().argmax(1) == yb
            (g,) = torch.autograd.grad(F.cross_entropy(logits, yb, reduction="sum"), xa)
            with torch.no_grad():
                xa = xa + PGD_STEP * g.sign()
                xa = torch.min(torch.max(xa, xb - eps), xb + eps).clamp(0.0, 1.0)
        with torch.no_grad():
            ok &= model(xa).argmax(1) == yb
        out.append(ok)
    for p in model.parameters():
        p.requires_grad_(True)
    return torch.cat(out)


def train(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace,
          x_val: torch.Tensor, y_val: torch.Tensor) -> None:
    """IBP training in place: warm-up, linear ε and κ ramp, then held; Adam with step decay."""
    gen = torch.Generator().manual_seed(args.seed)
    n = len(y)
    spe = math.ceil(n / BATCH)
    warm, ramp = args.warmup_epochs * spe, args.ramp_epochs * spe
    total = args.epochs * spe
    eps_train = args.eps_train / 255
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    decay_at = [round(total * f) for f in (0.7, 0.9)]
    it = 0
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(n, generator=gen)
        loss_sum = 0.0
        for b in range(spe):
            frac = min(1.0, max(0.0, (it - warm) / max(1, ramp)))
            eps, kappa = frac * eps_train, 1.0 - 0.5 * frac
            for g in opt.param_groups:
                g["lr"] = args.lr * 0.1 ** sum(it >= d for d in decay_at)
            idx = perm[b * BATCH : (b + 1) * BATCH]
            xb, yb = x[idx], y[idx]
            loss = kappa * F.cross_entropy(model(xb), yb)
            if it >= warm:
                loss = loss + (1 - kappa) * F.cross_entropy(-ibp_margins(model, xb, yb, eps), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            it += 1
            loss_sum += float(loss.detach()) * len(yb)
        model.eval()
        with torch.no_grad():
            val = float((model(x_val).argmax(1) == y_val).float().mean())
        cert = float(certified_mask(model, x_val, y_val, 2 / 255).float().mean())
        log(
            f"epoch {epoch + 1}/{args.epochs} eps {eps * 255:.2f}/255 kappa {kappa:.2f} "
            f"loss {loss_sum / n:.4f} val clean {val:.4f} val IBP@2/255 {cert:.4f} "
            f"[{time.perf_counter() - t0:.0f} s]"
        )


def weights_sha256(model: nn.Module) -> str:
    """sha256 over every tensor of the state dict (names and raw bytes), in order."""
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def export_onnx(model: nn.Module, path: Path, meta: dict[str, str]) -> None:
    """Export ``model`` (eval mode) to ONNX opset 17 with a symbolic batch and add metadata."""
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.zeros(1, 3, 32, 32),),
            str(path),
            dynamo=False,
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=17,
        )
    proto = onnx.load(str(path))
    for k, v in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = k, v
    proto.producer_name = "certify benchmarks/train_certified.py"
    onnx.checker.check_model(proto)
    ops = {node.op_type for node in proto.graph.node}
    assert ops <= {"Conv", "Relu", "Flatten", "Gemm"}, ops
    onnx.save(proto, str(path))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("certify/demo"), help="output directory")
    p.add_argument("--no-export", action="store_true", help="train and evaluate only")
    p.add_argument("--seed", type=int, default=0, help="initialisation and shuffling seed")
    p.add_argument("--train-per-class", type=int, default=300, help="training signs per class")
    p.add_argument("--hidden", type=int, default=100, help="units of the hidden FC layer")
    p.add_argument("--arch", choices=["small", "deep"], default="small", help="architecture")
    p.add_argument("--eps-train", type=float, default=4.0, help="training ε, in 1/255")
    p.add_argument("--epochs", type=int, default=80, help="epochs in all")
    p.add_argument("--warmup-epochs", type=int, default=5, help="natural epochs first")
    p.add_argument("--ramp-epochs", type=int, default=30, help="epochs of the ε and κ ramp")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (×0.1 at 70%%, 90%%)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (fixed)")
    p.add_argument("--cache", type=Path, default=None, help="npz cache of the generated data")
    return p.parse_args(argv)


def load_data(args: argparse.Namespace) -> tuple[np.ndarray, ...]:
    """Training, validation and demo test sets (uint8 NHWC and labels), maybe from a cache."""
    key = np.array([args.train_per_class, TRAIN_SEED, VAL_PER_CLASS, VAL_SEED, DEMO_SEED])
    if args.cache is not None and args.cache.is_file():
        with np.load(args.cache) as z:
            if np.array_equal(z["key"], key):
                return tuple(z[k] for k in ("xt", "yt", "xv", "yv", "xd", "yd"))
    xt, yt = generate(args.train_per_class, seed=TRAIN_SEED)
    xv, yv = generate(VAL_PER_CLASS, seed=VAL_SEED)
    xd, yd = generate(DEMO_PER_CLASS, seed=DEMO_SEED)
    if args.cache is not None:
        np.savez(args.cache, xt=xt, yt=yt, xv=xv, yv=yv, xd=xd, yd=yd, key=key)
    return xt, yt, xv, yv, xd, yd


def main(argv: list[str] | None = None) -> int:
    """Train, evaluate, export and verify the certified demo CNN; record its figures."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    t_wall, t_cpu = time.perf_counter(), cpu_seconds()

    xt, yt, xv, yv, xd, yd = load_data(args)
    gen_cpu = cpu_seconds() - t_cpu
    log(f"data: {len(yt)} train, {len(yv)} validation, {len(yd)} demo test [{gen_cpu:.0f} CPU s]")
    x_tr, y_tr = to_tensor(xt), torch.from_numpy(yt)
    x_val, y_val = to_tensor(xv), torch.from_numpy(yv)
    x_te, y_te = to_tensor(xd), torch.from_numpy(yd)

    model = build_model(args.hidden, args.arch)
    t_train = cpu_seconds()
    train(model, x_tr, y_tr, args, x_val, y_val)
    train_cpu = cpu_seconds() - t_train
    model.eval()

    with torch.no_grad():
        ref_logits = model(x_te)
    clean_ok = ref_logits.argmax(1) == y_te
    cert1 = certified_mask(model, x_te, y_te, 1 / 255)
    cert2 = certified_mask(model, x_te, y_te, 2 / 255)
    pgd_ok = pgd_correct(model, x_te, y_te, 2 / 255, torch.Generator().manual_seed(99))
    # Soundness: a certified sign is correct on the clean input and survives the attack.
    assert not bool((cert2 & ~clean_ok).any()), "IBP certified a misclassified sign"
    assert bool((cert1 | ~cert2).all()), "certified at 2/255 but not at 1/255"
    broken = int((cert2 & ~pgd_ok).sum())
    assert broken == 0, f"PGD broke {broken} signs that IBP certified at 2/255"
    n = len(y_te)
    fig = {
        "clean": float(clean_ok.float().mean()),
        "ibp_1": float(cert1.float().mean()),
        "ibp_2": float(cert2.float().mean()),
        "pgd_2": float(pgd_ok.float().mean()),
    }
    assert fig["pgd_2"] >= fig["ibp_2"]
    log(
        f"demo test set (n={n}): clean {fig['clean']:.4f}, IBP-certified 1/255 {fig['ibp_1']:.4f}, "
        f"2/255 {fig['ibp_2']:.4f}, PGD-{PGD_STEPS} 2/255 {fig['pgd_2']:.4f}; "
        f"training {train_cpu:.0f} CPU s"
    )
    if args.no_export:
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "certified.onnx"
    export_onnx(model, path, {
        "model_name": "certify-demo-certified",
        "training_seed": str(args.seed),
        "description": "IBP-trained small CNN on certify synthetic GTSRB-like signs",
        "training": f"IBP (Gowal et al. 2018), Linf eps_train={args.eps_train:g}/255",
        "input": "float32 [N,3,32,32] RGB in [0,1]; no mean/std normalisation",
        "labels": "43 GTSRB classes, certify.demo.synthetic.GTSRB_CLASS_NAMES order",
        "demo_test_clean_accuracy": f"{fig['clean']:.4f}",
        "demo_test_ibp_certified_linf_2_255": f"{fig['ibp_2']:.4f}",
    })
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ort_logits = sess.run(["logits"], {"input": x_te.numpy()})[0]
    gap = float(np.abs(ort_logits - ref_logits.numpy()).max())
    ort_ok = torch.from_numpy(ort_logits.argmax(1) == yd)
    ort_clean = float(ort_ok.float().mean())
    size = path.stat().st_size
    log(f"{path}: {size} bytes; onnxruntime clean {ort_clean:.4f}, max |logit gap| {gap:.2e}")
    assert gap < 1e-3 and bool((ort_ok == clean_ok).all()), (gap, ort_clean)

    figures_path = args.out / "figures.json"
    figures: dict[str, Any] = (
        json.loads(figures_path.read_text()) if figures_path.is_file() else {"models": {}}
    )
    figures.setdefault("models", {})["certified"] = {
        "file": path.name,
        "training": "ibp",
        "command": "python benchmarks/train_certified.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "test_set": f"generate(n_per_class={DEMO_PER_CLASS}, seed={DEMO_SEED}) (the demo's)",
        "n_test": n,
        "clean_accuracy": round(fig["clean"], 4),
        "onnxruntime_clean_accuracy": round(ort_clean, 4),
        "onnxruntime_max_logit_gap": float(f"{gap:.3g}"),
        "ibp_certified": {
            "norm": "linf",
            "method": "IBP, last layer folded into the margin (plain torch)",
            "1/255": round(fig["ibp_1"], 4),
            "2/255": round(fig["ibp_2"], 4),
        },
        "pgd": {
            "norm": "linf",
            "eps": "2/255",
            "steps": PGD_STEPS,
            "step_size": "0.5/255",
            "random_start": True,
            "restarts": 1,
            "seed": 99,
            "robust_accuracy": round(fig["pgd_2"], 4),
        },
        "params": sum(p.numel() for p in model.parameters()),
        "file_bytes": size,
        "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "weights_sha256": weights_sha256(model),
        "training_seed": args.seed,
        "train_data": f"generate(n_per_class={args.train_per_class}, seed={TRAIN_SEED})",
        "validation_data": f"generate(n_per_class={VAL_PER_CLASS}, seed={VAL_SEED})",
        "epochs": args.epochs,
        "warmup_epochs": args.warmup_epochs,
        "ramp_epochs": args.ramp_epochs,
        "eps_train": f"{args.eps_train:g}/255",
        "kappa": "1 -> 0.5 over the ramp",
        "batch_size": BATCH,
        "optimizer": f"Adam lr {args.lr:g}, x0.1 at 70% and 90% of the steps",
        "threads": args.threads,
        "train_cpu_s": round(train_cpu, 1),
        "total_cpu_s": round(cpu_seconds() - t_cpu, 1),
        "total_wall_s": round(time.perf_counter() - t_wall, 1),
        "torch_version": torch.__version__,
        "python": platform.python_version(),
    }
    figures_path.write_text(json.dumps(figures, indent=2) + "\n")
    log(f"wrote {figures_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
