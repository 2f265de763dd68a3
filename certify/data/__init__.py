"""Datasets: GTSRB (official test layout and the common CSV/PNG layout), image folders, ``.npz``.

A :class:`Dataset` holds the images already in certify's currency: float32 ``[N, C, H, W]`` in
``[0, 1]`` at the model's input size, with integer labels and a stable id per sample.
"""

from __future__ import annotations

from certify.data.loaders import (
    INTERPOLATIONS,
    Dataset,
    DataSpec,
    load_dataset,
    stratified_subset,
)

__all__ = ["INTERPOLATIONS", "DataSpec", "Dataset", "load_dataset", "stratified_subset"]
