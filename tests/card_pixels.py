"""The card's pages as Chromium prints them, and how far two renderings of a page differ.

The card's pictures are compared by pixels: the demo card's HTML is printed to PDF by headless
Chromium (A4, the card's print stylesheet, no header or footer), chosen pages are rasterised by
``pdftoppm`` at :data:`DPI` in grey, and two renderings of the same page are compared after a
:data:`BLOCK`-pixel box average, so that a glyph or a line that moved by a pixel does not count
as a changed picture while a figure that lost its bars, curve or labels does.

The pages are found by text, not by number: page 1, and the first page holding each of
:data:`PAGES`' headings (pages move when text above them grows).

``python tests/card_pixels.py RUN_DIR`` writes the reference images (``tests/data/card_pixels``)
from a finished demo run's ``card.html``; the references in the repository were made at
167906b-8ab9c8a (matplotlib's figures), before the card's figures were written as SVG directly.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REFERENCES = Path(__file__).resolve().parent / "data" / "card_pixels"
#: Resolution of the compared pages (A4 at 50 dpi: 413 x 585 pixels).
DPI = 50
#: Side of the box the pages are averaged over before they are compared.
BLOCK = 3
#: The pages compared: a name and the line that finds its page (a regular expression matched
#: against a whole line, a heading; ``None``: page 1). Clean
#: accuracy holds the per-class bar chart; uniform_noise's evidence its failure-probability
#: curves; rotation's its robustness curve against the bound.
PAGES = {"page-1": None, "per-class": r"Clean accuracy",
         "failure-bound": r"uniform_noise\s+[A-Z]+", "curve": r"rotation\s+[A-Z]+"}


def print_pdf(html: Path, pdf: Path) -> None:
    """``html`` printed to ``pdf`` by headless Chromium (A4, no header or footer)."""
    assert CHROMIUM is not None
    profile = tempfile.mkdtemp()
    try:
        proc = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-first-run", "--no-pdf-header-footer",
             f"--user-data-dir={profile}", f"--print-to-pdf={pdf}", html.resolve().as_uri()],
            capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert pdf.is_file() and pdf.stat().st_size > 0, proc.stderr[-2000:]


def page_texts(pdf: Path) -> list[str]:
    """Each page's text (``pdftotext``; pages split at form feeds)."""
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], check=True,
                          capture_output=True, text=True).stdout
    return text.split("\f")


def find_pages(pdf: Path) -> dict[str, int]:
    """The page number (1-based) of each of :data:`PAGES`."""
    texts = page_texts(pdf)
    found = {}
    for name, needle in PAGES.items():
        if needle is None:
            found[name] = 1
            continue
        line = re.compile(rf"^\s*{needle}\s*$", re.M)
        hits = [k + 1 for k, t in enumerate(texts) if line.search(t)]
        assert hits, f"no page of the card has a line {needle!r}"
        found[name] = hits[0]
    return found


def page_image(pdf: Path, page: int) -> np.ndarray:
    """Page ``page`` of ``pdf`` in grey at :data:`DPI` (uint8)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["pdftoppm", "-r", str(DPI), "-gray", "-png", "-f", str(page), "-l",
                        str(page), "-singlefile", str(pdf), f"{tmp}/p"], check=True)
        with Image.open(f"{tmp}/p.png") as im:
            return np.asarray(im.convert("L"), dtype=np.uint8)


def _blocks(a: np.ndarray) -> np.ndarray:
    h, w = (a.shape[0] // BLOCK) * BLOCK, (a.shape[1] // BLOCK) * BLOCK
    return a[:h, :w].astype(np.float64).reshape(h // BLOCK, BLOCK, w // BLOCK,
                                                BLOCK).mean(axis=(1, 3))


def difference(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """How far two renderings of a page differ, after the box average: the mean absolute
    difference in grey levels (0-255), and the share of boxes that differ by more than 48
    levels (a box whose ink came or went)."""
    assert a.shape == b.shape, f"the pages differ in size: {a.shape} and {b.shape}"
    d = np.abs(_blocks(a) - _blocks(b))
    return {"mean": float(d.mean()), "changed": float((d > 48).mean())}


def pages(html: Path, tmp: Path) -> dict[str, np.ndarray]:
    """Each of :data:`PAGES` of ``html`` as Chromium prints it."""
    pdf = tmp / "chromium.pdf"
    print_pdf(html, pdf)
    return {name: page_image(pdf, k) for name, k in find_pages(pdf).items()}


def main(run: Path) -> None:
    """Write the reference images from ``run``'s ``card.html``."""
    REFERENCES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, image in pages(run / "card.html", Path(tmp)).items():
            Image.fromarray(image).save(REFERENCES / f"{name}.png", optimize=True)
            print(REFERENCES / f"{name}.png", image.shape)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
