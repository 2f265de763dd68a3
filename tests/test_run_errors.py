"""A run's error message, stored on the run and returned by the API, shows no server path
(issue 38 point 5): not the service's home or store however they were spelled to it (a
relative ``--home``, a symlink), not a registered dataset's folder, not where certify and
Python are installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from certify.service import job
from certify.service.config import ServeConfig
from certify.service.db import Run
from certify.service.workers import job_spec

pytestmark = pytest.mark.unit


def _run(model_ref: str, dataset: str = "gtsrb", suite: str = "gtsrb") -> Run:
    return Run(id="a" * 32, model_kind="onnx", model_ref=model_ref, model_name="m",
               suite=suite, suite_name=suite, dataset=dataset, options={}, secret_enc=None)


def test_a_bad_model_under_a_relative_home_is_named_by_its_store_path(tmp_path, monkeypatch):
    """The reproduction: with ``--home home`` the error said
    ``home/store/models/bad/m.onnx is not a readable ONNX model``."""
    from certify.service.keys import signing_key_path

    monkeypatch.chdir(tmp_path)
    home = Path("home")
    cfg = ServeConfig(home=home, sign_key=signing_key_path(home, None),
                      datasets={"gtsrb": tmp_path / "data" / "gtsrb"})
    (cfg.store_root / "models" / "bad").mkdir(parents=True)
    (cfg.store_root / "models" / "bad" / "m.onnx").write_bytes(b"not onnx")
    folder = cfg.store_root / "runs" / ("a" * 32)
    folder.mkdir(parents=True)
    spec = job_spec(_run("models/bad/m.onnx"), cfg, cfg.store_root)
    (folder / job.JOB_FILE).write_text(json.dumps(spec))
    error = job.run_job(folder, None)["error"]
    assert "models/bad/m.onnx is not a readable ONNX model" in error
    assert "home/" not in error and str(tmp_path) not in error, error


def test_every_server_folder_is_cut_in_every_spelling(tmp_path, monkeypatch):
    import certify
    from certify.suite import packaged_suites

    real = tmp_path / "srv"
    (real / "home" / "store" / "runs" / ("a" * 32)).mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)  # the service was told a symlink's path
    data = tmp_path / "data" / "gtsrb"
    data.mkdir(parents=True)
    cfg = ServeConfig(home=tmp_path / "link" / "home", datasets={"gtsrb": data})
    folder = cfg.store_root / "runs" / ("a" * 32)
    spec = job_spec(_run("models/x/m.onnx"), cfg, cfg.store_root)
    suite_file = packaged_suites()["gtsrb"]
    library = Path(json.__file__)
    said = {
        f"{cfg.store_root}/models/x/m.onnx is not a readable ONNX model": "models/x/m.onnx",
        f"{real}/home/store/suites/s.yaml: unknown key": "suites/s.yaml",
        f"cannot read key {cfg.home}/keys/service.key": "keys/service.key",
        f"cannot read key {real}/home/keys/service.key": "keys/service.key",
        f"{data}/00001/x.ppm is not an image": "00001/x.ppm",
        f"no images in {data}": "gtsrb",
        f"suite {suite_file}: check refused": suite_file.name,
        f"internal error: OSError: '{library}'": library.name,
    }
    folders = [str(tmp_path), str(Path(certify.__file__).parent.parent), sys.prefix]
    for text, kept in said.items():
        out = job._no_server_paths(text, folder, spec)
        assert kept in out, (text, out)
        assert not any(f in out for f in folders), (text, out)
