"""Train certify's two bundled demo CNNs on the procedural traffic-sign generator.

Both models share one small architecture (about 207k float32 parameters, under 1 MB as ONNX),
take ``[N, 3, 32, 32]`` RGB images scaled to ``[0, 1]`` and return 43 GTSRB logits:

* ``standard.onnx``: ordinary training (cross-entropy, light random-shift augmentation).
* ``robust.onnx``: PGD adversarial training (Madry et al.), L-infinity, eps = 8/255, with eps
  ramped up linearly over the first epochs; step size eps/4 with a random start.

Data come from :func:`certify.demo.synthetic.generate`: the training set is
``generate(n_per_class=N, seed=SEED)`` and the held-out set is
``generate(n_per_class=100, seed=SEED, start_index=1_000_000)`` (4,300 images from a disjoint
index range of the same distribution).

The run is deterministic on CPU: fixed seeds, ``torch.use_deterministic_algorithms(True)``, a
fixed thread count and ``torch.Generator`` objects for every random draw (shuffling,
augmentation, PGD starts), so the same seed and options give the same weights, the same
accuracies and byte-identical ONNX files (``figures.json`` records the sha256 of both).

Run from the repository root::

    .venv/bin/python scripts/train_demo.py [--out certify/demo] [--seed 0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
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

from certify.demo.synthetic import NUM_CLASSES, generate

HELDOUT_PER_CLASS = 100
HELDOUT_START = 1_000_000
EPS = 8 / 255
BATCH = 128
EVAL_BATCH = 500
DESCRIPTION = "trained on certify synthetic GTSRB-like signs"


def log(msg: str) -> None:
    """Print a progress line immediately."""
    print(msg, flush=True)


def set_determinism(seed: int, threads: int) -> None:
    """Seed torch and make every CPU kernel deterministic at a fixed thread count.

    ``fill_uninitialized_memory`` is switched off: it only NaN-fills freshly allocated buffers
    (which every op used here overwrites) and costs about a third of the run time on CPU.
    """
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False


def build_model() -> nn.Sequential:
    """The demo CNN: conv16-pool-conv32-conv32-pool-conv64-conv64-pool-fc128-fc43 with BN."""

    def block(c_in: int, c_out: int) -> list[nn.Module]:
        return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]

    return nn.Sequential(
        *block(3, 16),
        nn.MaxPool2d(2),  # 16x16
        *block(16, 32),
        *block(32, 32),
        nn.MaxPool2d(2),  # 8x8
        *block(32, 64),
        *block(64, 64),
        nn.MaxPool2d(2),  # 4x4
        nn.Flatten(),
        nn.Linear(64 * 4 * 4, 128),
        nn.ReLU(),
        nn.Linear(128, NUM_CLASSES),
    )


def to_tensor(x: np.ndarray) -> torch.Tensor:
    """uint8 NHWC images to a contiguous float32 NCHW tensor in ``[0, 1]``."""
    return torch.from_numpy(x).permute(0, 3, 1, 2).float().div_(255.0).contiguous()


def load_data(
    seed: int, train_per_class: int, cache: Path | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """Generate (or load from ``cache``) the training and held-out sets.

    A cache file is used only when its recorded seed and sizes match; otherwise the sets are
    regenerated from the seed and the cache is (re)written.
    """
    t0 = time.perf_counter()
    if cache is not None and cache.is_file():
        with np.load(cache) as z:
            meta = z["meta"].tolist()
            if meta == [seed, train_per_class, HELDOUT_PER_CLASS, HELDOUT_START]:
                log(f"data: loaded from cache {cache}")
                info = {"source": "cache", "generate_s": None}
                return z["x_train"], z["y_train"], z["x_test"], z["y_test"], info
            log(f"data: cache {cache} is for other options, regenerating")
    x_tr, y_tr = generate(n_per_class=train_per_class, seed=seed)
    x_te, y_te = generate(n_per_class=HELDOUT_PER_CLASS, seed=seed, start_index=HELDOUT_START)
    gen_s = time.perf_counter() - t0
    log(f"data: generated {len(y_tr)} train + {len(y_te)} held-out images in {gen_s:.1f} s")
    if cache is not None:
        meta_arr = np.array([seed, train_per_class, HELDOUT_PER_CLASS, HELDOUT_START])
        np.savez(cache, x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te, meta=meta_arr)
    return x_tr, y_tr, x_te, y_te, {"source": "generated", "generate_s": round(gen_s, 1)}


def random_shift(x: torch.Tensor, max_shift: int, gen: torch.Generator) -> torch.Tensor:
    """Translate each image by up to ``max_shift`` pixels (edge padding), never flipping."""
    if max_shift <= 0:
        return x
    n, _, h, w = x.shape
    padded = F.pad(x, (max_shift,) * 4, mode="replicate")
    offs = torch.randint(0, 2 * max_shift + 1, (n, 2), generator=gen)
    out = torch.empty_like(x)
    for i in range(n):
        dy, dx = int(offs[i, 0]), int(offs[i, 1])
        out[i] = padded[i, :, dy : dy + h, dx : dx + w]
    return out


def pgd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    step: float,
    steps: int,
    gen: torch.Generator,
) -> torch.Tensor:
    """L-infinity PGD on the cross-entropy loss with a uniform random start in the eps-ball.

    Parameters' gradients are not computed; the model's train/eval mode is left as it is.
    """
    if eps <= 0 or steps <= 0:
        return x
    req = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    delta = torch.empty_like(x).uniform_(-eps, eps, generator=gen)
    x_adv = (x + delta).clamp_(0.0, 1.0)
    for _ in range(steps):
        x_adv.requires_grad_(True)
        loss = F.cross_entropy(model(x_adv), y)
        (grad,) = torch.autograd.grad(loss, x_adv)
        with torch.no_grad():
            x_adv = x_adv + step * grad.sign()
            x_adv = torch.min(torch.max(x_adv, x - eps), x + eps).clamp_(0.0, 1.0)
    for p, r in zip(model.parameters(), req, strict=True):
        p.requires_grad_(r)
    return x_adv.detach()


def train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    seed: int,
    adversarial: bool,
    pgd_steps: int,
    warmup_epochs: float,
    max_shift: int,
    name: str,
) -> float:
    """Train ``model`` in place with SGD (Nesterov), one-epoch LR warm-up, then cosine decay.

    With ``adversarial`` each batch is replaced by its PGD example (eps ramped linearly from 0
    to 8/255 over ``warmup_epochs``, step eps/4, ``pgd_steps`` steps, random start). Returns the
    wall time in seconds.
    """
    gen = torch.Generator().manual_seed(seed)
    n = len(y)
    steps_per_epoch = math.ceil(n / BATCH)
    total = epochs * steps_per_epoch
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)

    def lr_at(it: int) -> float:
        if it < steps_per_epoch:
            return (it + 1) / steps_per_epoch
        frac = (it - steps_per_epoch) / max(1, total - steps_per_epoch)
        return 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    t0 = time.perf_counter()
    it = 0
    for epoch in range(epochs):
        model.train()
        perm = torch.randperm(n, generator=gen)
        loss_sum, correct = 0.0, 0
        for b in range(steps_per_epoch):
            idx = perm[b * BATCH : (b + 1) * BATCH]
            xb, yb = random_shift(x[idx], max_shift, gen), y[idx]
            eps = 0.0
            if adversarial:
                eps = EPS * min(1.0, (it + 1) / max(1.0, warmup_epochs * steps_per_epoch))
                xb = pgd(model, xb, yb, eps, eps / 4, pgd_steps, gen)
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            it += 1
            loss_sum += float(loss.detach()) * len(yb)
            correct += int((logits.argmax(1) == yb).sum())
        log(
            f"{name}: epoch {epoch + 1}/{epochs} loss {loss_sum / n:.4f} "
            f"train acc {correct / n:.4f}{f' (eps {eps * 255:.2f}/255)' if adversarial else ''} "
            f"[{time.perf_counter() - t0:.0f} s]"
        )
    return time.perf_counter() - t0


@torch.no_grad()
def logits_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Logits of ``model`` (eval mode), computed in batches."""
    model.eval()
    return torch.cat([model(x[i : i + EVAL_BATCH]) for i in range(0, len(x), EVAL_BATCH)])


def robust_accuracy(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, step: float, seed: int
) -> float:
    """Accuracy under PGD-``steps`` (L-infinity, eps 8/255, random start) in eval mode."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    correct = 0
    for i in range(0, len(x), EVAL_BATCH):
        xb, yb = x[i : i + EVAL_BATCH], y[i : i + EVAL_BATCH]
        x_adv = pgd(model, xb, yb, EPS, step, steps, gen)
        with torch.no_grad():
            correct += int((model(x_adv).argmax(1) == yb).sum())
    return correct / len(y)


def weights_sha256(model: nn.Module) -> str:
    """sha256 over every tensor of the state dict (names and raw bytes), in order."""
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def export_onnx(model: nn.Module, path: Path, name: str, seed: int, extra: dict[str, str]) -> None:
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
    meta = {
        "model_name": f"certify-demo-{name}",
        "training_seed": str(seed),
        "description": DESCRIPTION,
        "input": "float32 [N,3,32,32] RGB in [0,1]; no mean/std normalisation",
        "labels": "43 GTSRB classes, certify.demo.synthetic.GTSRB_CLASS_NAMES order",
        **extra,
    }
    for k, v in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = k, v
    proto.producer_name = "certify scripts/train_demo.py"
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))


def onnx_accuracy(
    path: Path, x: torch.Tensor, y: torch.Tensor, ref_logits: torch.Tensor
) -> tuple[float, float]:
    """Accuracy of the exported file on onnxruntime (CPU) and its max |logit| gap to torch."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    xs = x.numpy()
    logits = np.concatenate(
        [
            sess.run(["logits"], {"input": xs[i : i + EVAL_BATCH]})[0]
            for i in range(0, len(xs), EVAL_BATCH)
        ]
    )
    gap = float(np.abs(logits - ref_logits.numpy()).max())
    return float((logits.argmax(1) == y.numpy()).mean()), gap


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("certify/demo"), help="output directory")
    p.add_argument("--seed", type=int, default=0, help="data and training seed")
    p.add_argument("--train-per-class", type=int, default=300, help="training images per class")
    p.add_argument("--epochs", type=int, default=12, help="epochs of the standard model")
    p.add_argument("--robust-epochs", type=int, default=12, help="epochs of the robust model")
    p.add_argument(
        "--warmup-epochs",
        type=float,
        default=3.0,
        help="epochs over which the robust model's eps ramps up to 8/255",
    )
    p.add_argument("--pgd-train-steps", type=int, default=5, help="PGD steps in training")
    p.add_argument("--pgd-eval-steps", type=int, default=20, help="PGD steps in evaluation")
    p.add_argument(
        "--pgd-eval-n",
        type=int,
        default=0,
        help="held-out images for the PGD evaluation (0 = all 4,300)",
    )
    p.add_argument("--lr", type=float, default=0.05, help="peak SGD learning rate")
    p.add_argument("--max-shift", type=int, default=2, help="random shift augmentation, pixels")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (fixed)")
    p.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="npz cache of the generated data (read if it matches, else written)",
    )
    p.add_argument(
        "--only",
        choices=["standard", "robust"],
        default=None,
        help="train only one model (for experiments)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train, evaluate, export and verify both demo models; write ``figures.json``."""
    args = parse_args(argv)
    t_start = time.perf_counter()
    set_determinism(args.seed, args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    x_tr_u8, y_tr_np, x_te_u8, y_te_np, data_info = load_data(
        args.seed, args.train_per_class, args.cache
    )
    x_tr, y_tr = to_tensor(x_tr_u8), torch.from_numpy(y_tr_np)
    x_te, y_te = to_tensor(x_te_u8), torch.from_numpy(y_te_np)
    n_pgd = len(y_te) if args.pgd_eval_n <= 0 else min(args.pgd_eval_n, len(y_te))
    # An evenly spaced (class-balanced) subset when fewer than all held-out images are attacked.
    pgd_idx = torch.linspace(0, len(y_te) - 1, n_pgd).round().long()
    pgd_step = 2 / 255

    specs: dict[str, dict[str, Any]] = {
        "standard": {"adversarial": False, "epochs": args.epochs, "seed_offset": 1},
        "robust": {"adversarial": True, "epochs": args.robust_epochs, "seed_offset": 2},
    }
    figures: dict[str, Any] = {
        "description": "certify demo models " + DESCRIPTION,
        "command": (
            "python scripts/train_demo.py " + " ".join(sys.argv[1:] if argv is None else argv)
        ).strip(),
        "data": {
            "generator": "certify.demo.synthetic.generate",
            "train": f"generate(n_per_class={args.train_per_class}, seed={args.seed})",
            "heldout": f"generate(n_per_class={HELDOUT_PER_CLASS}, seed={args.seed}, "
            f"start_index={HELDOUT_START})",
            **data_info,
        },
        "environment": {
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": ort.__version__,
            "python": platform.python_version(),
            "threads": args.threads,
            "cpu": platform.processor() or platform.machine(),
        },
        "models": {},
    }
    only = [args.only] if args.only else list(specs)
    for name in only:
        spec = specs[name]
        torch.manual_seed(args.seed * 1000 + spec["seed_offset"])
        model = build_model()
        n_params = sum(p.numel() for p in model.parameters())
        train_s = train(
            model,
            x_tr,
            y_tr,
            epochs=spec["epochs"],
            lr=args.lr,
            seed=args.seed * 1000 + spec["seed_offset"],
            adversarial=spec["adversarial"],
            pgd_steps=args.pgd_train_steps,
            warmup_epochs=args.warmup_epochs,
            max_shift=args.max_shift,
            name=name,
        )
        ref_logits = logits_of(model, x_te)
        clean = float((ref_logits.argmax(1) == y_te).float().mean())
        t_eval = time.perf_counter()
        rob = robust_accuracy(
            model,
            x_te[pgd_idx],
            y_te[pgd_idx],
            args.pgd_eval_steps,
            pgd_step,
            seed=args.seed * 1000 + 99,
        )
        eval_s = time.perf_counter() - t_eval
        log(
            f"{name}: clean {clean:.4f}, PGD-{args.pgd_eval_steps} robust {rob:.4f} "
            f"(n={n_pgd}, {eval_s:.0f} s)"
        )
        path = args.out / f"{name}.onnx"
        export_onnx(
            model,
            path,
            name,
            args.seed,
            {
                "training": "PGD adversarial training, Linf eps=8/255"
                if spec["adversarial"]
                else "standard cross-entropy training",
                "heldout_clean_accuracy": f"{clean:.4f}",
                "heldout_pgd_linf_8_255_accuracy": f"{rob:.4f}",
            },
        )
        ort_acc, gap = onnx_accuracy(path, x_te, y_te, ref_logits)
        log(
            f"{name}: onnxruntime held-out accuracy {ort_acc:.4f} (torch {clean:.4f}, max logit "
            f"gap {gap:.2e}); {path} {path.stat().st_size} bytes"
        )
        if abs(ort_acc - clean) > 1.5 / len(y_te):
            raise SystemExit(f"{name}: onnxruntime accuracy {ort_acc} != torch accuracy {clean}")
        figures["models"][name] = {
            "file": path.name,
            "training": "pgd_adversarial" if spec["adversarial"] else "standard",
            "clean_accuracy": round(clean, 4),
            "onnxruntime_clean_accuracy": round(ort_acc, 4),
            "onnxruntime_max_logit_gap": float(f"{gap:.3g}"),
            "n_heldout": len(y_te),
            "pgd": {
                "norm": "linf",
                "eps": "8/255",
                "eps_value": EPS,
                "steps": args.pgd_eval_steps,
                "step_size": "2/255",
                "random_start": True,
                "seed": args.seed * 1000 + 99,
                "n": n_pgd,
                "robust_accuracy": round(rob, 4),
            },
            "params": n_params,
            "file_bytes": path.stat().st_size,
            "file_sha256": file_sha256(path),
            "weights_sha256": weights_sha256(model),
            "training_seed": args.seed,
            "epochs": spec["epochs"],
            "train_images": len(y_tr),
            "batch_size": BATCH,
            "lr": args.lr,
            "max_shift": args.max_shift,
            "train_pgd": (
                {
                    "eps": "8/255",
                    "warmup_epochs": args.warmup_epochs,
                    "steps": args.pgd_train_steps,
                    "step_size": "eps/4",
                    "random_start": True,
                }
                if spec["adversarial"]
                else None
            ),
            "train_wall_s": round(train_s, 1),
            "pgd_eval_wall_s": round(eval_s, 1),
            "torch_version": torch.__version__,
        }
    figures["total_wall_s"] = round(time.perf_counter() - t_start, 1)
    previous = args.out / "figures.json"
    if previous.is_file():
        # keep the entries this run did not retrain (e.g. ``certified``, written by
        # benchmarks/train_certified.py)
        for name, entry in json.loads(previous.read_text()).get("models", {}).items():
            figures["models"].setdefault(name, entry)
    (args.out / "figures.json").write_text(json.dumps(figures, indent=2) + "\n")
    log(f"done in {figures['total_wall_s']:.0f} s; wrote {args.out / 'figures.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
