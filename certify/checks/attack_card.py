"""What an attack row shows on the card: its headline, its figure and its gallery.

Presentation only: the numbers are the verdict's (:mod:`certify.checks.attack_verdict`); the
adversarial images come from the records (:func:`keep_adversarial_images` stores them while the
attack runs, :func:`gallery_examples` picks the card's).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from certify.checks.attack_schedule import AttackRecord
from certify.data import Dataset
from certify.images import ImageSink, decode_png, png_bytes, to_uint8
from certify.norms import Norm
from certify.norms import norm as norm_named

if TYPE_CHECKING:
    import torch

#: Adversarial examples a check shows on the card: the first broken samples in sample order.
#: Each record batch keeps the adversarial image of its first this-many broken samples, which
#: always include the check's first this-many (a subset's first k broken are among them).
GALLERY_EXAMPLES = 6
#: What the confidence beside an adversarial label is, per kind of model output.
CONFIDENCE_OF = {"probs": "probability", "logits": "softmax of logits",
                 "labels": "labels only: no confidence"}


def histogram(values: list[int], top: int, bins: int = 10) -> list[dict[str, int]]:
    edges = [round(top * k / bins) for k in range(bins + 1)]
    out = []
    for lo, hi in zip(edges, edges[1:], strict=False):
        out.append({"from": lo, "to": hi,
                    "count": sum(lo < v <= hi or (lo == 0 and v == 0) for v in values)})
    return out


def keep_adversarial_images(recs: list[AttackRecord], attacked: list[int],
                            index: Sequence[int], x_adv: torch.Tensor, output: str) -> None:
    """Store the adversarial image of the batch's first :data:`GALLERY_EXAMPLES` broken samples
    (in dataset order) in their records, as a lossless 8-bit PNG (base64).

    ``attacked[k]`` is the batch position of ``x_adv[k]``; ``output`` the model's kind of
    answer (what the recorded confidence is). The image is the point the record's
    ``adv_pred`` and ``confidence`` describe, so the card's gallery comes from the records
    alone: after ``--resume``, on any executor, for the round that broke the sample.
    """
    broken = sorted((k for k, j in enumerate(attacked) if recs[j]["outcome"] == "broken"),
                    key=lambda k: int(index[attacked[k]]))
    for k in broken[:GALLERY_EXAMPLES]:
        png = png_bytes(to_uint8(x_adv[k]))
        recs[attacked[k]].update({"adv_image": base64.b64encode(png).decode("ascii"),
                                  "scores": output})


def _class_name(names: Sequence[str], c: int) -> str:
    return names[c] if 0 <= c < len(names) else str(c)


def gallery_examples(records: Sequence[AttackRecord], data: Dataset | None, norm: Norm | str,
                     sink: ImageSink) -> list[dict[str, Any]]:
    """The card's adversarial examples: the first :data:`GALLERY_EXAMPLES` broken samples (in
    sample order) whose records hold their adversarial image.

    Each example names its sample, the true and the adversarial label, the adversarial label's
    confidence and what it is (:data:`CONFIDENCE_OF`), the round that broke it, and the digests
    of three images (their pixels go to ``sink``): the original, the adversarial image and the
    perturbation made visible: for L0 the changed pixels in white on black
    (``changed_pixels`` counts them), otherwise mid-grey plus the 8-bit difference times
    ``amplification`` (the largest whole factor that keeps it within [0, 255]). Without a
    dataset (records summarised on their own) there are no originals: no examples.
    """
    if data is None:
        return []
    picked = sorted((r for r in records if r["outcome"] == "broken" and "adv_image" in r),
                    key=lambda r: int(r["i"]))
    out: list[dict[str, Any]] = []
    for r in picked:
        if len(out) == GALLERY_EXAMPLES:
            break
        original = to_uint8(data.x[int(r["i"])])
        try:
            adversarial = decode_png(base64.b64decode(r["adv_image"], validate=True))
        except (ValueError, binascii.Error):
            continue  # a damaged record shows no picture; its outcome still counts
        if adversarial.shape != original.shape:
            continue
        delta = adversarial.astype("int16") - original.astype("int16")
        ex: dict[str, Any] = {
            "id": r["id"], "index": int(r["i"]), "label": int(r["label"]),
            "label_name": _class_name(data.class_names, int(r["label"])),
            "pred": int(r["adv_pred"]),
            "pred_name": _class_name(data.class_names, int(r["adv_pred"])),
            "confidence": None if r.get("scores") == "labels" or "probability" not in r
            else float(r["probability"]),
            "confidence_of": CONFIDENCE_OF.get(str(r.get("scores")), "unknown"),
            "round": int(r.get("broken_round", 0)),
        }
        if norm_named(norm).sparse:
            changed = (delta != 0).any(axis=2)
            shown = (changed[..., None] * 255).repeat(3, axis=2).astype("uint8")
            ex["changed_pixels"] = int(changed.sum())
        else:
            peak = int(abs(delta).max())
            factor = max(1, 127 // peak) if peak else 1
            shown = (128 + factor * delta).clip(0, 255).astype("uint8")
            ex["amplification"] = factor
        ex.update(original=sink.add_pixels(original), adversarial=sink.add_pixels(adversarial),
                  perturbation=sink.add_pixels(shown))
        out.append(ex)
    return out
