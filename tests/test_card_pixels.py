"""The card's pictures stay the same pictures (issue 53): page 1 and three figure pages of the
demo card, printed by headless Chromium, against the references made when matplotlib drew the
figures (``tests/card_pixels.py`` says how they are compared and made).

The demo is deterministic: two demo runs print to identical pages (difference 0.0). Written as
SVG directly, the figures differ from matplotlib's by at most 0.85 grey levels on average over
a page and in 0.15% of its 3-pixel boxes (measured at 8ab9c8a + this change). The thresholds
below leave room for that and for font rasterisation across Chromium releases, and are far
below what a damaged figure costs: the control test takes the bars out of the per-class chart.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from PIL import Image

import card_pixels

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(card_pixels.CHROMIUM is None,
                                 reason="Debian's chromium is installed by setup.sh")]

#: A page passes when its mean difference and its share of changed boxes are both within these.
MEAN_LEVELS = 2.0
CHANGED_SHARE = 0.005


def _reference(name: str) -> np.ndarray:
    with Image.open(card_pixels.REFERENCES / f"{name}.png") as im:
        return np.asarray(im.convert("L"), dtype=np.uint8)


@pytest.fixture(scope="module")
def printed(demo_run, tmp_path_factory) -> dict[str, np.ndarray]:
    return card_pixels.pages(demo_run / "card.html", tmp_path_factory.mktemp("pixels"))


@pytest.mark.parametrize("name", list(card_pixels.PAGES))
def test_the_card_pages_look_as_they_did(printed, name):
    diff = card_pixels.difference(_reference(name), printed[name])
    assert diff["mean"] <= MEAN_LEVELS and diff["changed"] <= CHANGED_SHARE, (name, diff)


def test_a_damaged_figure_is_seen(demo_run, tmp_path):
    """The control: the per-class chart without its bars is beyond the thresholds, and the
    pages the damage does not touch are not."""
    html = (demo_run / "card.html").read_text(encoding="utf-8")
    chart = re.search(r'<svg[^>]*role="img"[^>]*><title>Accuracy per class.*?</svg>', html, re.S)
    assert chart is not None
    bare = re.sub(r'<path fill="#[0-9a-f]{6}" d="[^"]*"/>', "", chart.group(0))
    assert bare != chart.group(0)
    card = tmp_path / "card.html"
    card.write_text(html.replace(chart.group(0), bare), encoding="utf-8")
    pages = card_pixels.pages(card, tmp_path)
    damaged = card_pixels.difference(_reference("per-class"), pages["per-class"])
    assert damaged["mean"] > 2 * MEAN_LEVELS and damaged["changed"] > 2 * CHANGED_SHARE, damaged
    untouched = card_pixels.difference(_reference("page-1"), pages["page-1"])
    assert untouched["mean"] <= MEAN_LEVELS, untouched
