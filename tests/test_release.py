"""What the card and the bundle vouch for, and the documented release path (issue 16.8, 16.9).

One signed run of a model saved with external weights (``weights.bin``), with a passphrase
protected key as docs/github-actions.md uses it, an awkward file name and HTML in its ONNX
metadata, is shared by the tests that look at it; the tests that change something copy it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from certify.errors import ModelError, UsageError
from certify.onnx_files import external_data_files, model_identity, sha256_file
from certify.rundir import RunDir, check_out_dir

import builders

pytestmark = pytest.mark.e2e

PASS_ENV = {"CERTIFY_TEST_PW": "correct horse battery staple"}
NAME = "<i>signs|*v1*_[x]`.onnx"  # markdown and HTML in the model's name
META = {"author": "<script>alert(1)</script>", "note": "<b>bold</b> & co"}


def _save_external(proto: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    return path


@pytest.fixture(scope="module")
def ext_model(net, tmp_path_factory) -> Path:
    """The tiny net saved as a graph file plus weights.bin, with HTML in its metadata."""
    tmp = tmp_path_factory.mktemp("ext")
    proto = onnx.load(str(builders.export(net, tmp / "embedded.onnx")))
    for k, v in META.items():
        proto.metadata_props.add(key=k, value=v)
    return _save_external(proto, tmp / "model" / NAME)


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("keys")
    proc = builders.run_cli("keygen", "--out", out, "--passphrase-env", "CERTIFY_TEST_PW",
                            env=PASS_ENV)
    assert proc.returncode == 0, proc.stderr
    assert b"ENCRYPTED" in (out / "certify.key").read_bytes()
    return out


@pytest.fixture(scope="module")
def signed_run(ext_model, keys, clean_suite, npz_path, tmp_path_factory) -> Path:
    """`certify run --sign-key K --passphrase-env VAR`, with the PDF, as a release would."""
    out = tmp_path_factory.mktemp("release") / "run"
    proc = builders.run_cli("run", ext_model, "--suite", clean_suite, "--data", npz_path,
                            "--out", out, "--sign-key", keys / "certify.key",
                            "--passphrase-env", "CERTIFY_TEST_PW", env=PASS_ENV)
    assert proc.returncode in (0, 1), proc.stderr
    return out


def _zeroed_copy(model: Path, dest: Path) -> Path:
    shutil.copytree(model.parent, dest)
    weights = dest / "weights.bin"
    weights.write_bytes(bytes(weights.stat().st_size))
    return dest / model.name


# -- 16.9 the documented release path ---------------------------------------------------------
@pytest.mark.parametrize("name", ["card.html", "card.pdf", "results.json"])
def test_signed_with_a_passphrase_key_verifies(signed_run, keys, name):
    proc = builders.run_cli("verify", signed_run / name, "--pubkey", keys / "certify.pub")
    assert proc.returncode == 0, proc.stderr
    assert "OK:" in proc.stdout


def test_wrong_passphrase_is_refused_before_any_work(ext_model, keys, clean_suite, npz_path,
                                                     tmp_path):
    out = tmp_path / "run"
    proc = builders.run_cli("run", ext_model, "--suite", clean_suite, "--data", npz_path,
                            "--out", out, "--sign-key", keys / "certify.key",
                            "--passphrase-env", "CERTIFY_TEST_PW",
                            env={"CERTIFY_TEST_PW": "wrong"})
    assert proc.returncode == 2, proc.stderr
    assert "passphrase" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_model_metadata_and_name_are_escaped_on_the_card(signed_run):
    html = (signed_run / "card.html").read_text(encoding="utf-8")
    for raw in ("<script>alert(1)</script>", "<b>bold</b>", "<i>signs"):
        assert raw not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;b&gt;bold&lt;/b&gt;" in html


def test_endpoint_reported_names_are_escaped_on_the_card(model_path, clean_suite, npz_path,
                                                         tmp_path):
    from servers import OnnxHttpServer

    server = OnnxHttpServer(model_path, metadata={"platform": "<script>alert(2)</script>",
                                                  "versions": ["<b>v9</b>"]})
    try:
        out = tmp_path / "run"
        proc = builders.run_cli("run", server.v2_url, "--suite", clean_suite, "--data",
                                npz_path, "--samples", "43", "--out", out, "--no-pdf")
    finally:
        server.stop()
    assert proc.returncode in (0, 1), proc.stderr
    meta = json.loads((out / "results.json").read_text())["measurement"]["model"]["metadata"]
    assert meta["platform"] == "<script>alert(2)</script>"  # recorded as reported
    html = (out / "card.html").read_text(encoding="utf-8")
    assert "<script>alert(2)" not in html and "<b>v9</b>" not in html
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html


# -- 16.8 the model's identity covers its external data ----------------------------------------
def test_external_weights_change_the_identity(ext_model, tmp_path):
    assert external_data_files(ext_model) == ["weights.bin"]
    zeroed = _zeroed_copy(ext_model, tmp_path / "zeroed")
    assert sha256_file(zeroed) == sha256_file(ext_model)  # the graph file alone is unchanged
    assert model_identity(zeroed) != model_identity(ext_model)
    assert model_identity(tmp_path / "zeroed" / ext_model.name) == model_identity(zeroed)
    shutil.copytree(ext_model.parent, tmp_path / "same")
    assert model_identity(tmp_path / "same" / ext_model.name) == model_identity(ext_model)


def test_resume_with_changed_external_weights_is_refused(signed_run, ext_model, clean_suite,
                                                         npz_path, tmp_path):
    results = json.loads((signed_run / "results.json").read_text())
    assert results["measurement"]["model"]["identity"] == model_identity(ext_model)
    run = tmp_path / "run"
    shutil.copytree(signed_run, run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    zeroed = _zeroed_copy(ext_model, tmp_path / "zeroed")
    proc = builders.run_cli("run", zeroed, "--suite", clean_suite, "--data", npz_path,
                            "--out", run, "--resume", "--no-pdf")
    assert proc.returncode == 2, proc.stderr
    assert "model" in proc.stderr and "differ" in proc.stderr
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("location", ["../weights.bin", "/tmp/weights.bin"])
def test_external_data_outside_the_model_folder_is_refused(ext_model, tmp_path, location):
    proto = onnx.load(str(ext_model), load_external_data=False)
    for t in proto.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    shutil.copy2(ext_model.parent / "weights.bin", tmp_path / "weights.bin")
    evil = tmp_path / "sub" / "evil.onnx"
    evil.parent.mkdir()
    onnx.save_model(proto, str(evil))
    with pytest.raises(ModelError, match="outside its folder"):
        model_identity(evil)
    proc = builders.run_cli("run", evil, "--suite", "gtsrb", "--out", tmp_path / "o")
    assert proc.returncode == 3 and "outside its folder" in proc.stderr


# -- 16.8 certify bundle ------------------------------------------------------------------------
def _bundle(run: Path, model: Path, keys: Path, out: Path) -> object:
    return builders.run_cli("bundle", run, "--model", model, "--key", keys / "certify.key",
                            "--out", out, "--passphrase-env", "CERTIFY_TEST_PW", env=PASS_ENV)


def test_bundle_ships_the_external_weights(signed_run, ext_model, keys, tmp_path):
    pytest.importorskip("model_signing")
    out = tmp_path / "bundle"
    proc = _bundle(signed_run, ext_model, keys, out)
    assert proc.returncode == 0, proc.stderr
    assert (out / "weights.bin").read_bytes() == (ext_model.parent / "weights.bin").read_bytes()
    assert model_identity(out / ext_model.name) == model_identity(ext_model)
    ok = builders.run_cli("verify-bundle", out, "--signature", f"{out}.sigstore.json",
                          "--pubkey", keys / "certify.pub")
    assert ok.returncode == 0, ok.stderr


def test_bundle_refuses_a_model_that_is_not_the_certified_one(signed_run, ext_model, keys,
                                                              tmp_path):
    pytest.importorskip("model_signing")
    zeroed = _zeroed_copy(ext_model, tmp_path / "zeroed")
    out = tmp_path / "bundle"
    proc = _bundle(signed_run, zeroed, keys, out)
    assert proc.returncode == 2, proc.stderr
    assert "not the certified model" in proc.stderr
    assert not out.exists() and not Path(f"{out}.sigstore.json").exists()


def test_bundle_refuses_a_card_that_fails_verification(signed_run, ext_model, keys, tmp_path):
    pytest.importorskip("model_signing")
    run = tmp_path / "run"
    shutil.copytree(signed_run, run)
    html = (run / "card.html").read_text(encoding="utf-8")
    tampered = html.replace('"certify_version": "', '"certify_version": "9', 1)
    assert tampered != html
    (run / "card.html").write_text(tampered, encoding="utf-8")
    out = tmp_path / "bundle"
    proc = _bundle(run, ext_model, keys, out)
    assert proc.returncode == 1, proc.stderr
    assert "refusing to bundle" in proc.stderr and "card.html" in proc.stderr
    assert not out.exists()
    # signed by another key: the bundling key's public half does not verify it
    other = tmp_path / "other"
    assert builders.run_cli("keygen", "--out", other).returncode == 0
    proc = builders.run_cli("bundle", signed_run, "--model", ext_model, "--key",
                            other / "certify.key", "--out", out)
    assert proc.returncode == 1 and "refusing to bundle" in proc.stderr
    assert not out.exists()


def test_bundle_and_verify_bundle_import_no_torch(signed_run, ext_model, keys, tmp_path):
    """Issue 65: ``certify bundle`` reads the model's files through certify.onnx_files and the
    card through the report; ``verify-bundle`` checks the folder. In a fresh interpreter, after
    both ran, none of torch, onnxruntime, kornia or WeasyPrint is loaded, nor any module of
    the engine, the checks, the attacks or the model adapters."""
    pytest.importorskip("model_signing")
    out = tmp_path / "bundle"
    watched = ("torch", "onnxruntime", "kornia", "weasyprint", "certify.engine",
               "certify.checks", "certify.attacks", "certify.models")
    loaded, said = builders.loaded_after(
        [["bundle", str(signed_run), "--model", str(ext_model), "--key",
          str(keys / "certify.key"), "--out", str(out), "--passphrase-env", "CERTIFY_TEST_PW"],
         ["verify-bundle", str(out), "--signature", f"{out}.sigstore.json", "--pubkey",
          str(keys / "certify.pub")]], watched, env=PASS_ENV)
    assert "EXIT bundle 0" in said and "EXIT verify-bundle 0" in said, said
    assert (out / ext_model.name).is_file() and (out / "card.pdf").is_file(), said
    assert loaded == [], said


# -- 16.8 --out and the demo folder -------------------------------------------------------------
def test_out_into_a_folder_that_is_not_a_run_is_refused(model_path, clean_suite, npz_path,
                                                        tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "card.html").write_text("my own page")
    (out / "results.json").write_text("{}")
    for extra in ((), ("--resume",)):
        proc = builders.run_cli("run", model_path, "--suite", clean_suite, "--data", npz_path,
                                "--out", out, *extra)
        assert proc.returncode == 2, proc.stderr
        assert "not empty" in proc.stderr and "holds no certify run" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["card.html", "results.json"]
    assert (out / "card.html").read_text() == "my own page"
    # an empty folder is fine
    empty = tmp_path / "empty"
    empty.mkdir()
    check_out_dir(empty, resume=False)
    with pytest.raises(UsageError, match="is a file"):
        check_out_dir(out / "card.html", resume=False)


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file()}


def test_demo_rerun_into_its_earlier_folder_touches_nothing(tmp_path):
    out = tmp_path / "demo"
    (out / "demo-data").mkdir(parents=True)
    (out / "demo-data" / "synthetic-gtsrb-test.npz").write_bytes(b"earlier data")
    (out / "run.json").write_text('{"fingerprint": {}}')
    (out / "card.html").write_text("earlier card")
    before = _tree(out)
    proc = builders.run_cli("demo", "--out", out, "--no-pdf")
    assert proc.returncode == 2, proc.stderr
    assert "already holds a run" in proc.stderr and "--resume" in proc.stderr
    assert _tree(out) == before
    # a folder that is not a run is refused untouched too
    (out / "run.json").unlink()
    before = _tree(out)
    proc = builders.run_cli("demo", "--out", out, "--resume", "--no-pdf")
    assert proc.returncode == 2 and "holds no certify run" in proc.stderr
    assert _tree(out) == before


@pytest.mark.parametrize("state", ["fresh", "empty", "only-demo-data", "earlier-run"])
def test_demo_starts_or_resumes_like_run(state, tmp_path, monkeypatch):
    """run_demo's own steps (the full demo is test_demo's): it reaches the run when allowed."""
    import certify.api as api

    out = tmp_path / "demo"
    resume = state == "earlier-run"
    if state != "fresh":
        out.mkdir()
    if state == "only-demo-data":  # a demo killed while writing its data
        (out / "demo-data").mkdir()
    if state == "earlier-run":
        (out / "demo-data").mkdir()
        (out / "run.json").write_text('{"fingerprint": {}}')
    seen = {}

    def fake_certify(opts, progress=None):
        seen["opts"] = opts
        return {}, {}

    monkeypatch.setattr(api, "certify_model", fake_certify)
    monkeypatch.setattr(api, "DEMO_PER_CLASS", 1)
    api.run_demo(out, resume=resume)
    assert seen["opts"].resume is resume and seen["opts"].out == out
    assert np.load(out / "demo-data" / "synthetic-gtsrb-test.npz")["y"].size == 43


# -- 16.8 export and accurate timings ----------------------------------------------------------
def test_export_escapes_names_and_writes_no_local_path(signed_run, npz_path, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(signed_run, run)
    proc = builders.run_cli("export", run)
    assert proc.returncode == 0, proc.stderr
    summary = (run / "summary.md").read_text(encoding="utf-8")
    index = (run / "model-index.md").read_text(encoding="utf-8")
    for text in (summary, index):
        assert str(npz_path.parent) not in text and "/tmp/" not in text
        assert npz_path.name in text
    heading = summary.splitlines()[0]
    assert "<i>" not in summary and "&lt;i&gt;signs\\|\\*v1\\*\\_\\[x\\]\\`.onnx" in heading
    table = [line for line in summary.splitlines() if line.startswith("| ")]
    assert table and all(line.count(" | ") == 2 for line in table)  # no stray cell breaks


def test_resumed_records_counts_only_records_found_on_disk(tmp_path):
    fp = {"model": "m", "seed": 0}
    run = RunDir(tmp_path / "r", fp, resume=False)
    assert run.resumed_records == 0
    run.append("clean", [{"check": "clean", "i": i} for i in range(3)])
    assert run.resumed_records == 0
    run.close()
    again = RunDir(tmp_path / "r", fp, resume=True)
    assert again.resumed_records == 3
    again.append("clean", [{"check": "clean", "i": i} for i in range(3, 5)])
    assert again.resumed_records == 3 and len(again.records["clean"]) == 5
    again.close()
    assert len((tmp_path / "r" / "records.jsonl").read_text().splitlines()) == 5
