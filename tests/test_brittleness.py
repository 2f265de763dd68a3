"""Brittle score: LIME cross-check, determinism, and the paper's claim on the demo pair."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from certify.api import demo_model_path
from certify.checks.base import CheckContext
from certify.checks.brittleness import (
    Brittleness,
    cosine_to_all_on,
    lime_kernel,
    segment,
)
from certify.demo.synthetic import generate
from certify.device import choose_device
from certify.models.base import QueryCounter
from certify.models.onnx import OnnxModel

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def models():
    dev = choose_device("cpu")
    return (OnnxModel(demo_model_path("standard"), dev),
            OnnxModel(demo_model_path("robust"), dev))


@pytest.fixture(scope="module")
def images():
    x, y = generate(1, seed=123, classes=list(range(0, 43, 2)))
    return torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).float() / 255, torch.from_numpy(y)


def test_segmentation_gives_tens_of_superpixels(images):
    x, _ = images
    counts = [int(segment(img, 64, 20).max()) + 1 for img in x]
    assert min(counts) >= 20


def test_ridge_weights_equal_lime(models, images):
    """Same segmentation, masks and kernel: certify's weights equal lime's to 1e-6."""
    LimeBase = pytest.importorskip("lime.lime_base").LimeBase  # noqa: N806 - lime's class
    model, _ = models
    check = Brittleness(num_masks=300)
    x, _ = images
    for img in x[:4]:
        seg = segment(img, 64, 20)
        masks = check.masks(int(seg.max()) + 1, seed=9)
        ours, top = check.explain(model, img, seg, masks)
        imgs = check.masked_images(img, seg, masks)
        probs = torch.softmax(model.predict(imgs), dim=1).numpy().astype(np.float64)
        dist = cosine_to_all_on(masks)
        base = LimeBase(kernel_fn=lambda d: lime_kernel(d, 0.25), random_state=0)
        _, exp, _, _ = base.explain_instance_with_data(
            masks, probs, dist, top, num_features=masks.shape[1], feature_selection="none")
        theirs = np.zeros(masks.shape[1])
        for k, w in exp:
            theirs[k] = w
        np.testing.assert_allclose(ours, theirs, atol=1e-6, rtol=0)


def test_lime_fill_matches_mean_colour(images):
    x, _ = images
    img = x[0]
    seg = segment(img, 64, 20)
    masks = np.zeros((1, int(seg.max()) + 1))
    out = Brittleness.masked_images(img, seg, masks)[0]
    for s in range(3):
        region = torch.from_numpy(seg == s)
        assert torch.allclose(out[:, region], img[:, region].mean(dim=1, keepdim=True),
                              atol=1e-6)


def _scores(check, model, x, seed=0):
    ctx = CheckContext(check_seed=seed, device=torch.device("cpu"), class_names=[])
    counter = QueryCounter(model)
    recs = check.run_batch(counter, x, torch.zeros(len(x), dtype=torch.long),
                           list(range(len(x))), ctx)
    assert counter.queries == sum(r["queries"] for r in recs)
    return np.array([r["l1_per_dim"] for r in recs])


def test_score_is_deterministic_for_a_seed(models, images):
    model, _ = models
    x, _ = images
    check = Brittleness(num_masks=200)
    a, b = _scores(check, model, x[:3]), _scores(check, model, x[:3])
    assert np.array_equal(a, b)
    assert not np.array_equal(a, _scores(check, model, x[:3], seed=1))


def test_robust_model_is_less_brittle(models, images):
    standard, robust = models
    x, _ = images
    check = Brittleness(num_masks=300)
    s = _scores(check, standard, x).mean()
    r = _scores(check, robust, x).mean()
    assert r < s
