"""Unit tests of the small pieces: intervals, subsets, payload, run directory, suites."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from certify.canonical import canonical_json, script_safe_json
from certify.data import stratified_subset
from certify.errors import SuiteError, UsageError
from certify.rundir import RunDir
from certify.stats import wilson_interval
from certify.suite import load_suite, parse_suite

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]


def test_wilson_known_values():
    # Reference values (Wilson 1927; e.g. statsmodels proportion_confint(method="wilson")).
    lo, hi = wilson_interval(81, 263)
    assert lo == pytest.approx(0.2553, abs=1e-4)
    assert hi == pytest.approx(0.3662, abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)


@given(st.integers(1, 500), st.data())
def test_wilson_contains_estimate(n, data):
    k = data.draw(st.integers(0, n))
    lo, hi = wilson_interval(k, n)
    assert 0.0 <= lo <= k / n + 1e-12 <= hi + 2e-12 <= 1.0 + 2e-12


@settings(max_examples=50)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=300), st.integers(1, 400),
       st.integers(0, 2**32 - 1))
def test_stratified_subset(labels, n, seed):
    idx = stratified_subset(labels, n, seed)
    assert len(idx) == min(n, len(labels))
    assert len(set(idx.tolist())) == len(idx)
    assert np.array_equal(idx, stratified_subset(labels, n, seed))
    counts = np.bincount(np.asarray(labels)[idx], minlength=10)
    avail = np.bincount(labels, minlength=10)
    # a class that still had samples left never has 2 fewer than another class
    short = [c for c in range(10) if counts[c] < avail[c]]
    if short:
        assert counts.max() - min(counts[c] for c in short) <= 1


def test_canonical_json_is_stable_and_script_safe():
    doc = {"b": 0.1 + 0.2, "a": [1, 2.0, float("nan")], "name": "</script><b>"}
    assert canonical_json(doc) == canonical_json(json.loads(canonical_json(doc)))
    assert json.loads(canonical_json(doc))["b"] == 0.3
    safe = script_safe_json(doc)
    assert "</script>" not in safe
    assert json.loads(safe)["name"] == "</script><b>"


def test_rundir_drops_a_torn_last_line(tmp_path):
    fp = {"model": "m", "seed": 0}
    run = RunDir(tmp_path, fp, resume=False)
    run.append("clean", [{"check": "clean", "i": 0, "queries": 1}])
    run.close()
    with (tmp_path / "records.jsonl").open("a") as f:
        f.write('{"check": "clean", "i": 1, "que')  # SIGKILL mid-write
    run = RunDir(tmp_path, fp, resume=True)
    assert set(run.records["clean"]) == {0}
    run.append("clean", [{"check": "clean", "i": 1, "queries": 1}])
    run.close()
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert [json.loads(x)["i"] for x in lines] == [0, 1]
    with pytest.raises(UsageError):
        RunDir(tmp_path, {"model": "other", "seed": 0}, resume=True)


def test_packaged_suite_loads_with_digest():
    s = load_suite("gtsrb")
    assert len(s.classes) == 43
    assert s.digest.startswith("sha256:")
    kinds = [c.kind for c in s.checks]
    assert kinds[0] == "sanity"  # suspect-model checks run before any attack
    assert "clean_accuracy" in kinds and kinds.index("sanity") < kinds.index("attack")
    assert load_suite(str(ROOT / "suites" / "gtsrb.yaml")).digest == s.digest


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"name": "x", "classes": ["a"], "checks": [{"kind": "clean_accuracy",
                                                      "params": {"top": 3}}]}, "top_confusions"),
        ({"name": "x", "classes": ["a"], "checks": []}, "non-empty"),
        ({"name": "x", "classes": "a", "checks": [{"kind": "clean_accuracy"}]}, "classes"),
        ({"name": "x", "classes": ["a"], "checks": [{"kind": "clean_accuracy", "id": "c"},
                                                   {"kind": "clean_accuracy", "id": "c"}]},
         "repeated"),
        ({"name": "x", "classes": ["a"], "preprocessing": {"std": [0, 1, 1]},
          "checks": [{"kind": "clean_accuracy"}]}, "std"),
    ],
)
def test_suite_validation(raw, needle):
    with pytest.raises(SuiteError) as e:
        parse_suite(raw, "t.yaml")
    assert needle in e.value.message + (e.value.hint or "")


def test_wheel_ships_templates_and_suites(tmp_path):
    """A normal (non-editable) install finds the templates and suites."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("certify-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "certify/_templates/card.html.j2" in names
    assert "certify/_suites/gtsrb.yaml" in names
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(target), str(wheel)], check=True, capture_output=True)
    code = ("import certify, certify.suite as s, certify.report.card as c;"
            "print(certify.__file__); print(sorted(s.packaged_suites()));"
            "print(c.importlib.resources.files('certify._templates'))")
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, "
                          f"{str(target)!r}); {code}"], capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout
    assert str(target) in out.splitlines()[0]
    assert "gtsrb" in out
    assert str(target) in out.splitlines()[2]


def test_packed_outcome_bits_round_trip():
    from certify.results import pack_bits, unpack_bits

    rng = np.random.default_rng(4)
    for n in (1, 7, 8, 9, 430):
        flags = rng.random(n) < 0.3
        assert (unpack_bits(pack_bits(flags), n) == flags).all()
        # one bit per sample: 430 samples pack into 54 bytes
        assert len(base64.b64decode(pack_bits(flags))) == -(-n // 8)


@settings(max_examples=50)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=300), st.integers(1, 200),
       st.integers(1, 200), st.integers(0, 2**32 - 1))
def test_smaller_subsets_are_inside_larger_ones(labels, a, b, seed):
    # the runner draws every check's samples from one seeded order: checks of different sizes
    # share as many samples as the smaller one has
    small, large = sorted((a, b))
    assert set(stratified_subset(labels, small, seed).tolist()) <= \
        set(stratified_subset(labels, large, seed).tolist())


def test_cpu_onnx_calls_are_chunked_without_changing_outputs(model_path):
    """Large batches go to onnxruntime in calls of CPU_CHUNK images; outputs are the same."""
    from certify.device import choose_device
    from certify.models import onnx as onnx_model

    m = onnx_model.OnnxModel(model_path, choose_device("cpu"))
    assert m._cpu_chunk == onnx_model.CPU_CHUNK  # noqa: SLF001
    x = torch.rand(onnx_model.CPU_CHUNK * 2 + 3, *m.input_shape)
    calls: list[int] = []
    run = m.session.run

    def counting(names, feed):  # type: ignore[no-untyped-def]
        calls.append(len(next(iter(feed.values()))))
        return run(names, feed)

    m.session.run = counting  # type: ignore[method-assign]
    chunked = m.predict(x)
    assert calls == [onnx_model.CPU_CHUNK, onnx_model.CPU_CHUNK, 3]
    m._cpu_chunk = 0  # noqa: SLF001
    assert torch.allclose(chunked, m.predict(x), atol=1e-5)


def test_an_image_larger_than_a_card_image_is_refused_from_its_header():
    """A card image is decoded only within MAX_IMAGE_PIXELS: the size is read from the PNG's
    header, before any pixel is decoded (a genuine card with a huge image added to its visible
    part once cost the verifier over 1 GB)."""
    import io
    import struct
    import zlib

    from PIL import Image

    from certify.images import MAX_IMAGE_PIXELS, decode_png, png_bytes

    buf = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buf, format="PNG")
    png = bytearray(buf.getvalue())
    # IHDR starts at byte 8 (length, type, width, height, ...); give it 20,000 x 20,000 pixels
    # (10,000: where Pillow only warns; 20,000: where it raises its own error)
    for side in (5_000, 10_000, 20_000):
        png[16:24] = struct.pack(">II", side, side)
        png[29:33] = struct.pack(">I", zlib.crc32(bytes(png[12:29])))
        assert side ** 2 > MAX_IMAGE_PIXELS
        with pytest.raises(ValueError, match="larger than a card image may be"):
            decode_png(bytes(png))
    small = np.zeros((64, 48, 3), np.uint8)
    assert decode_png(png_bytes(small)).shape == (64, 48, 3)
