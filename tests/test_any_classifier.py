"""Any image classifier (issue 30, point 4): the generic suite, class names from wherever they
are, ``certify init``'s preprocessing probe, the chance-level fix, and what loading did to
the data (resizing, sample caps, skipped files) recorded for the card.

The acceptance case wraps the demo's standard model (NCHW, 0–1, 32×32) so that it takes NHWC
float 0–255 images at 64×64 (Transpose, Mul by 1/255 and a linear Resize in front of the
original graph, built with the ``onnx`` helper API), with an image folder of its classes named
after them. Everything runs in-process on 129 images (3 per class).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from certify.api import DEMO_SEED, demo_model_path
from certify.data import DataSpec, load_dataset
from certify.data.classes import (
    FROM_IDS,
    metadata_class_names,
    read_labels,
    resolve_class_names,
)
from certify.demo.synthetic import GTSRB_CLASS_NAMES, generate
from certify.errors import CARD_WRITTEN_CODES, DataError, SuiteError
from certify.probe import at_chance, candidates, mcnemar_p
from certify.stats import mcnemar_exact
from certify.suite import load_suite, parse_suite, resolve_suite_path

import builders

pytestmark = pytest.mark.e2e

#: GTSRB's class names as folder names ("Beware of ice/snow" has a slash).
NAMES = [n.replace("/", "-") for n in GTSRB_CLASS_NAMES]
PER_CLASS = 3


def wrap_nhwc_255_64(path: Path, labels: list[str] | None = None) -> Path:
    """The demo's standard model behind Transpose (NHWC -> NCHW), Mul by 1/255 and a linear
    half-pixel Resize from 64×64 to its 32×32 input: a model that takes NHWC 0–255 at 64×64."""
    inner = onnx.load(str(demo_model_path("standard")))
    g = inner.graph
    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 64, 64, 3])
    front = [
        helper.make_node("Transpose", ["image"], ["nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Mul", ["nchw", "inv255"], ["unit"]),
        helper.make_node("Resize", ["unit", "", "half"], [g.input[0].name], mode="linear",
                         coordinate_transformation_mode="half_pixel"),
    ]
    consts = [numpy_helper.from_array(np.array(1 / 255, np.float32), "inv255"),
              numpy_helper.from_array(np.array([1, 1, 0.5, 0.5], np.float32), "half")]
    graph = helper.make_graph(front + list(g.node), "nhwc_255_64", [image], list(g.output),
                              consts + list(g.initializer))
    model = helper.make_model(graph, opset_imports=list(inner.opset_import))
    model.ir_version = inner.ir_version
    if labels is not None:
        helper.set_model_props(model, {"labels": json.dumps(labels)})
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def acceptance(tmp_path_factory):
    """The wrapped model (its class names in its metadata) and a named image folder of its
    classes: generated signs upscaled (bilinear) to 64×64 PNGs."""
    root = tmp_path_factory.mktemp("any")
    model = wrap_nhwc_255_64(root / "wrapped.onnx", NAMES)
    x, y = generate(PER_CLASS, seed=DEMO_SEED)
    images = root / "images"
    for i, (im, c) in enumerate(zip(x, y, strict=True)):
        d = images / NAMES[c]
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(im).resize((64, 64), Image.Resampling.BILINEAR).save(d / f"{i:04d}.png")
    return model, images


def reference_accuracy(images: Path) -> tuple[int, int]:
    """(correct, n) of standard.onnx run directly by onnxruntime on the folder's images brought
    to 32×32 as the wrapper's Resize does (linear, half-pixel, exactly 2×: the mean of each
    2×2 block), computed with numpy."""
    xs, ys = [], []
    for c, name in enumerate(NAMES):
        for f in sorted((images / name).iterdir()):
            a = np.asarray(Image.open(f).convert("RGB"), dtype=np.float32) / 255.0
            xs.append(a.reshape(32, 2, 32, 2, 3).mean(axis=(1, 3)).transpose(2, 0, 1))
            ys.append(c)
    sess = ort.InferenceSession(str(demo_model_path("standard")),
                                providers=["CPUExecutionProvider"])
    logits = sess.run(None, {sess.get_inputs()[0].name: np.stack(xs)})[0]
    return int((logits.argmax(axis=1) == np.array(ys)).sum()), len(ys)


def clean_only(suite: Path, dest: Path, **pre: float) -> Path:
    """The suite cut to its clean-accuracy check (with ``pre`` set in its preprocessing)."""
    raw = yaml.safe_load(suite.read_text())
    raw["checks"] = [c for c in raw["checks"] if c["kind"] == "clean_accuracy"]
    raw["preprocessing"].update(pre)
    dest.write_text(yaml.safe_dump(raw, sort_keys=False))
    return dest


def results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def test_init_picks_nhwc_0_255_and_the_run_gives_the_known_accuracy(acceptance, tmp_path):
    model, images = acceptance
    suite = tmp_path / "suite.yaml"
    proc = builders.run_cli("init", model, "--data", images, "--out", suite)
    assert proc.returncode == 0, proc.stderr
    chosen = next(line for line in proc.stdout.splitlines() if "<- chosen" in line)
    assert chosen.startswith("0–255, RGB, NHWC"), proc.stdout
    assert "0–1, RGB, NHWC" in proc.stdout  # the table lists the other candidates
    pre = yaml.safe_load(suite.read_text())["preprocessing"]
    assert pre == {"input_scale": 255, "mean": [0, 0, 0], "std": [1, 1, 1],
                   "channel_order": "RGB"}, pre  # no input_size: the model states 64×64
    written = load_suite(str(suite))
    assert written.classes == tuple(NAMES)  # from the model's metadata, folders by name
    assert "43 from the model's metadata ('labels'), matching the data's folder names" \
        in proc.stdout
    assert len(written.checks) == len(load_suite("image-classification").checks)

    out = tmp_path / "run"
    proc = builders.run_cli("run", model, "--suite", clean_only(suite, tmp_path / "c.yaml"),
                            "--data", images, "--out", out, "--no-pdf")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = results(out)
    clean = r["measurement"]["checks"][0]
    correct, n = reference_accuracy(images)
    assert clean["metrics"]["n"] == n == 43 * PER_CLASS
    # The wrapper's Resize (float32 interpolation in onnxruntime) and the reference's numpy
    # 2×2 mean differ by rounding (~1e-7 of a pixel), and 255 * x / 255 by one float ulp: a
    # prediction can only change where two logits tie to that precision, so at most one of
    # the 129 samples may differ.
    assert abs(clean["metrics"]["correct"] - correct) <= 1, (clean["metrics"], correct)
    assert correct / n > 0.9  # the demo model's accuracy, not a chance coincidence
    data = r["measurement"]["data"]
    assert data["class_names"] == NAMES
    assert data["class_names_source"] == "the suite's classes list"  # init wrote them there
    assert data["resized"] is None  # 64×64 is the wrapped model's own input size
    assert data["sample_cap"] == {"requested": 500, "available": n, "used": n}  # the suite's
    assert clean["warnings"] == [] and "preprocessing_probe" not in clean["details"]


def test_wrong_input_scale_gets_a_warning_that_names_the_fix(acceptance, tmp_path):
    model, images = acceptance
    suite = clean_only(resolve_suite_path("image-classification"), tmp_path / "s.yaml",
                       input_scale=1.0)
    out = tmp_path / "run"
    proc = builders.run_cli("run", model, "--suite", suite, "--data", images, "--out", out,
                            "--no-pdf")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # FAIL: the card is still written
    clean = results(out)["measurement"]["checks"][0]
    [warning] = clean["warnings"]
    assert "at chance level (1/43 = 2.3%)" in warning, warning
    assert "--input-scale 255" in warning and "input_scale: 255" in warning, warning
    assert "0–255 input" in warning
    probe = clean["details"]["preprocessing_probe"]
    assert probe["fix"] == warning and probe["n"] == 64
    assert probe["candidates"][0]["preprocessing"] == "0–255, RGB, NHWC"
    assert "--input-scale 255" in (out / "card.html").read_text()
    assert "--input-scale 255" in proc.stderr  # and in the log


def test_resize_sample_cap_and_skipped_files_are_recorded(acceptance, tmp_path):
    """The demo model (32×32) on 64×64 images in integer class-id folders, a stray text file,
    and --samples above what the folder holds."""
    _, images = acceptance
    folder = tmp_path / "ids"
    for c, name in enumerate(NAMES[:5]):
        d = folder / f"{c:05d}"
        d.mkdir(parents=True)
        for f in sorted((images / name).iterdir()):
            (d / f.name).write_bytes(f.read_bytes())
    (folder / "00000" / "README.txt").write_text("not an image")
    suite = clean_only(resolve_suite_path("image-classification"), tmp_path / "s.yaml")
    out = tmp_path / "run"
    proc = builders.run_cli("run", demo_model_path("standard"), "--suite", suite, "--data",
                            folder, "--samples", 5000, "--out", out, "--no-pdf")
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    data = results(out)["measurement"]["data"]
    n = 5 * PER_CLASS
    assert data["n"] == n
    assert data["resized"] == {"count": n, "of": n, "to": [32, 32], "from": [[64, 64]],
                               "distinct_sizes": 1, "interpolation": "bilinear"}
    assert data["sample_cap"] == {"requested": 5000, "available": n, "used": n}
    assert data["skipped"] == {"count": 1, "reason": "not an image file",
                               "examples": ["00000/README.txt"]}
    assert len(data["notes"]) == 3
    assert data["class_names"] == [str(i) for i in range(43)]
    assert data["class_names_source"] == FROM_IDS
    for needle in ("resized from 64×64 to 32×32", "5000 samples were asked for",
                   "README.txt"):
        assert needle in proc.stderr, proc.stderr  # one log line each


def test_labels_file_and_npz_class_names_name_the_classes(tmp_path):
    x, y = generate(1, seed=DEMO_SEED)
    suite = clean_only(resolve_suite_path("image-classification"), tmp_path / "s.yaml")
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(f"sign {i}" for i in range(43)) + "\n\n")
    npz = tmp_path / "d.npz"
    np.savez(npz, x=x, y=y, class_names=np.array(NAMES))
    model = demo_model_path("standard")

    proc = builders.run_cli("run", model, "--suite", suite, "--data", npz, "--out",
                            tmp_path / "a", "--no-pdf")
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    data = results(tmp_path / "a")["measurement"]["data"]
    assert data["class_names"] == NAMES
    assert data["class_names_source"] == "the data (d.npz's class_names array)"

    proc = builders.run_cli("run", model, "--suite", suite, "--data", npz, "--labels", labels,
                            "--out", tmp_path / "b", "--no-pdf")
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    data = results(tmp_path / "b")["measurement"]["data"]  # --labels comes first
    assert data["class_names"][:2] == ["sign 0", "sign 1"]
    assert data["class_names_source"] == "--labels labels.txt"

    labels.write_text("a\nb\nc\n")
    proc = builders.run_cli("run", model, "--suite", suite, "--data", npz, "--labels", labels,
                            "--out", tmp_path / "c", "--no-pdf")
    assert proc.returncode == 2
    assert "outputs 43 scores but --labels labels.txt names 3 classes" in proc.stderr
    assert not (tmp_path / "c").exists()


@pytest.mark.unit
def test_named_image_folders_are_labelled_by_name(tmp_path):
    for name in ("dog", "cat", "bird"):
        (tmp_path / name).mkdir()
        Image.new("RGB", (8, 8), (10, 20, 30)).save(tmp_path / name / "a.png")
    spec = DataSpec(path=str(tmp_path))
    # names that include the folders: each folder is its name's class id
    data = load_dataset(spec, (8, 8), ["cat", "dog", "fish", "bird"])
    labelled = sorted(zip(data.ids, data.y.tolist(), strict=True))
    assert labelled == [("bird/a.png", 3), ("cat/a.png", 0), ("dog/a.png", 1)]
    # other names, as many as folders: sorted order (torchvision's ImageFolder convention)
    data = load_dataset(spec, (8, 8), ["x", "y", "z"])
    labelled = sorted(zip(data.ids, data.y.tolist(), strict=True))
    assert labelled == [("bird/a.png", 0), ("cat/a.png", 1), ("dog/a.png", 2)]
    with pytest.raises(DataError, match="subfolder 'bird' is not one of the 2 class names"):
        load_dataset(spec, (8, 8), ["cat", "dog"])


@pytest.mark.unit
def test_class_names_precedence_and_metadata_forms(tmp_path):
    meta_list = {"labels": json.dumps(["a", "b", "c"])}
    assert metadata_class_names(meta_list) == (["a", "b", "c"], "labels")
    assert metadata_class_names({"names": "{0: 'a', 1: 'b'}"}) == (["a", "b"], "names")
    assert metadata_class_names({"class_names": "a\nb\nc"}) == (["a", "b", "c"], "class_names")
    assert metadata_class_names({"classes": "a, b"}) == (["a", "b"], "classes")
    assert metadata_class_names({"labels": "[]", "producer": "x"}) is None
    data = (["c", "a", "b"], "the data")
    r = resolve_class_names(num_classes=3, data=data, metadata=meta_list)
    assert r.names == ("a", "b", "c") and "matching the data's folder names" in r.source
    assert resolve_class_names(num_classes=3, data=data).names == ("c", "a", "b")
    assert resolve_class_names(num_classes=3, metadata=meta_list).source == \
        "the model's metadata ('labels')"
    assert resolve_class_names(num_classes=3, labels=["x", "y", "z"], data=data,
                               metadata=meta_list).names == ("x", "y", "z")
    assert resolve_class_names(num_classes=2).names == ("0", "1")
    with pytest.raises(SuiteError, match="outputs 4 scores but the data names 3 classes"):
        resolve_class_names(num_classes=4, data=data)
    f = tmp_path / "l.txt"
    f.write_text("a\n\nb\n")
    with pytest.raises(DataError, match="empty class name"):
        read_labels(f)
    f.write_text("a\na\n")
    with pytest.raises(DataError, match="twice"):
        read_labels(f)


@pytest.mark.unit
def test_onnx_metadata_labels_reach_the_model_info(tmp_path):
    from certify.device import choose_device
    from certify.models import load_model

    path = wrap_nhwc_255_64(tmp_path / "m.onnx", NAMES)
    info = load_model(str(path), choose_device("cpu")).info
    assert (info.layout, info.input_shape, info.num_classes) == ("NHWC", (3, 64, 64), 43)
    assert metadata_class_names(info.metadata) == (NAMES, "labels")


@pytest.mark.unit
def test_suite_classes_may_be_a_count_or_absent():
    base = yaml.safe_load(resolve_suite_path("image-classification").read_text())
    generic = parse_suite(copy.deepcopy(base), "g.yaml")
    assert generic.classes == () and generic.class_count is None
    counted = parse_suite({**copy.deepcopy(base), "classes": 10}, "g.yaml")
    assert counted.class_count == 10
    assert counted.with_classes([str(i) for i in range(10)], "ids").classes[9] == "9"
    with pytest.raises(SuiteError, match="has 10 classes but x names 3"):
        counted.with_classes(["a", "b", "c"], "x")
    with pytest.raises(SuiteError, match="positive count"):
        parse_suite({**copy.deepcopy(base), "classes": 0}, "g.yaml")
    with pytest.raises(SuiteError, match="a list of strings or an integer"):
        parse_suite({**copy.deepcopy(base), "classes": "10"}, "g.yaml")
    assert load_suite("gtsrb").classes[0] == "Speed limit (20km/h)"  # unchanged


def test_generic_suite_is_packaged_and_listed():
    proc = builders.run_cli("suites", "list")
    assert proc.returncode == 0
    assert any(line.startswith("image-classification ") for line in proc.stdout.splitlines())
    proc = builders.run_cli("suites", "show", "image-classification")
    assert "thresholds are defaults to adjust" in proc.stdout.replace("\n  ", " ")
    kinds = {c.kind for c in load_suite("image-classification").checks}
    assert {"sanity", "clean_accuracy", "coverage", "corruption", "attack"} <= kinds
    props = [c.check.get_params().get("property")
             for c in load_suite("image-classification").checks if c.kind == "corruption"]
    assert "flip" not in props and "sticker" in props


def test_init_refusals(acceptance, tmp_path):
    model, images = acceptance
    out = tmp_path / "s.yaml"
    proc = builders.run_cli("init", model, "--data", tmp_path / "missing", "--out", out)
    assert proc.returncode == 2 and "data path not found" in proc.stderr
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    proc = builders.run_cli("init", bad, "--data", images, "--out", out)
    assert proc.returncode == 3 and "not a readable ONNX model" in proc.stderr
    proc = builders.run_cli("init", "http://127.0.0.1:9/v2/models/x", "--data", images,
                            "--out", out)
    assert proc.returncode == 3 and "could not be reached" in proc.stderr, proc.stderr
    assert not out.exists()
    out.write_text("mine")
    proc = builders.run_cli("init", model, "--data", images, "--out", out)
    assert proc.returncode == 2 and "--force" in proc.stderr
    assert out.read_text() == "mine"


@pytest.mark.unit
def test_probe_statistics():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.random(40) < 0.6, rng.random(40) < 0.4
        worse = int((a & ~b).sum())
        better = int((b & ~a).sum())
        assert mcnemar_p(a.tolist(), b.tolist()) == pytest.approx(mcnemar_exact(worse, better))
    assert at_chance(0.023, (0.01, 0.05), 43) and not at_chance(0.9, (0.85, 0.93), 43)
    assert at_chance(0.52, (0.40, 0.64), 2)
    # ImageNet mean/std is the same map at either scale: listed once per order and layout
    assert len(candidates(["NCHW"])) == 18 and len(candidates(["NCHW", "NHWC"])) == 36
