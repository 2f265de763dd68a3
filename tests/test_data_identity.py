"""Data identity is content (issue 51 point 3): the data digests cover the decoded images and
labels in order (and the preprocessing that changes pixels), whatever holds them: an ``.npz``,
an image folder, a GTSRB layout or arrays from Python. The source's name and layout are
recorded beside the digest, not in it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import certify
from certify.data.loaders import DataSpec, load_arrays, load_dataset
from certify.errors import CARD_WRITTEN_CODES, EXIT_NOT_COMPARABLE, EXIT_OK

import builders

pytestmark = pytest.mark.e2e

CLASSES = builders.CLASSES


def _data(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())["measurement"]["data"]


def _png_folder(root: Path, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x`` as PNG files in one subfolder per class id; returns the indices of ``x`` in the
    order the loader lists the folder (class folders, then file names, each sorted)."""
    for i, (img, label) in enumerate(zip(x, y, strict=True)):
        d = root / f"{label:02d}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(d / f"{i:05d}.png")
    return np.argsort(y, kind="stable")


def test_the_same_arrays_as_a_file_and_from_python_have_one_digest_and_compare(
        net, model_path: Path, clean_suite: Path, dataset_arrays: tuple,
        tmp_path: Path) -> None:
    x, y = dataset_arrays
    np.savez(tmp_path / "signs.npz", x=x, y=y)
    cli = tmp_path / "cli"
    proc = builders.run_cli("run", model_path, "--suite", clean_suite, "--data",
                            tmp_path / "signs.npz", "--samples", "43", "--out", cli, "--no-pdf")
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    py = tmp_path / "python"
    certify.evaluate(net, (x, y), suite=str(clean_suite), out=py, samples=43, pdf=False,
                     progress=None)
    a, b = _data(cli), _data(py)
    # the source is named beside the digest, not folded into it
    assert (a["layout"], b["layout"]) == ("npz", "arrays") and a["name"] != b["name"]
    assert a["digest"] == b["digest"] and a["source_digest"] == b["source_digest"]
    assert a["selection"] == b["selection"] and a["n"] == b["n"] == 43
    proc = builders.run_cli("compare", cli, py, "--json", "-")
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    (row,) = [r for r in doc["checks"] if r["kind"] == "clean_accuracy"]
    assert row["paired"] and row["outcome"] == "no change", row  # the very same samples

    # A card written before content digests carries the older definition's digests (the
    # file layout's name in it): compared with a new card by that definition, the same data
    # from a file compares, the arrays from Python do not, and the refusal says why.
    old = tmp_path / "old"
    old.mkdir()
    raw = json.loads((cli / "results.json").read_text())
    data = raw["measurement"]["data"]
    data.update(data.pop("older_digests"))
    (old / "results.json").write_text(json.dumps(raw))
    proc = builders.run_cli("compare", old, cli, "--json", "-")
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    assert next(r for r in json.loads(proc.stdout)["checks"]
                if r["kind"] == "clean_accuracy")["paired"]
    proc = builders.run_cli("compare", old, py)
    assert proc.returncode == EXIT_NOT_COMPARABLE, proc.stdout + proc.stderr
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "OLD was written by a certify whose data digest covered the image files' bytes" \
        in said and "rerun the older release's model with this certify" in said, said


def test_a_png_folder_and_a_gtsrb_layout_of_the_same_images_share_the_npz_source_digest(
        dataset_arrays: tuple, official_dir: Path, npz_path: Path, tmp_path: Path) -> None:
    x, y = dataset_arrays
    order = _png_folder(tmp_path / "folder", x, y)
    np.savez(tmp_path / "listed.npz", x=x[order], y=y[order])

    def load(path: Path, roi_crop: bool = True) -> tuple[str, str]:
        d = load_dataset(DataSpec(path=str(path), roi_crop=roi_crop), (32, 32), CLASSES)
        return d.source_digest, d.digest

    folder = load(tmp_path / "folder")
    assert folder == load(tmp_path / "listed.npz")  # the same images in the same order
    # another order is another sequence of samples
    assert folder[0] != load(npz_path)[0]
    # the GTSRB layout's images, cropped to their annotated regions, are the npz's images in
    # its CSV's order (the .ppm files' padding is outside the region)
    assert load(official_dir) == load(npz_path)
    assert load(official_dir, roi_crop=False)[0] != load(npz_path)[0]
    # a subset of the same source keeps the source's digest, not the samples'
    sub = load_dataset(DataSpec(path=str(tmp_path / "folder"), samples=43), (32, 32), CLASSES)
    assert sub.source_digest == folder[0] and sub.digest != folder[1]


def test_a_changed_label_or_pixel_changes_the_digests(dataset_arrays: tuple) -> None:
    x, y = dataset_arrays

    def digests(xs: np.ndarray, ys: np.ndarray, size: tuple[int, int] = (32, 32),
                interpolation: str = "bilinear") -> tuple[str, str]:
        d = load_arrays(xs, ys, DataSpec(interpolation=interpolation), size, CLASSES)
        return d.source_digest, d.digest

    base = digests(x, y)
    assert base == digests(x.copy(), y.copy())  # content, not the arrays' identity
    label = y.copy()
    label[7] = (label[7] + 1) % len(CLASSES)
    pixel = x.copy()
    pixel[7, 3, 4, 1] ^= 1
    for other in (digests(x, label), digests(pixel, y)):
        assert other[0] != base[0] and other[1] != base[1]
    # the interpolation changes pixels only when images are resized
    assert digests(x, y, interpolation="nearest") == base
    assert digests(x, y, (24, 24))[0] != base[0]
    assert digests(x, y, (24, 24), "nearest")[0] != digests(x, y, (24, 24))[0]


def test_an_unreadable_image_anywhere_in_the_source_is_named(dataset_arrays: tuple,
                                                            tmp_path: Path) -> None:
    """Every image of a folder is decoded for the source's digest, so a damaged one is refused
    even when the samples drawn leave it out (an unreadable image is an error, not a skip)."""
    from certify.errors import DataError

    x, y = dataset_arrays
    _png_folder(tmp_path / "folder", x[:20], y[:20])
    bad = next((tmp_path / "folder").glob("*/00003.png"))
    bad.write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"unreadable image .*00003\.png") as caught:
        load_dataset(DataSpec(path=str(tmp_path / "folder"), samples=2), (32, 32), CLASSES)
    assert caught.value.hint == "replace or remove the file"
