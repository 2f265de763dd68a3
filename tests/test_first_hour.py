"""Issue 62 point 4: no traps in a new user's first hour, each tried as that user met it.

- the default ``torch.onnx.export`` (the dynamo exporter) needs ``onnxscript``: certify
  installs it;
- a second model's run into the folder of the first: the refusal names a new folder (and
  ``init`` prints its ``certify run`` line with ``--out``);
- a ``.pt2`` saved at batch 1 is reported as exported at batch 1 (it said "dynamic");
- a TorchScript file from ``torch.jit.trace`` needs no ``input_size``: its traced example
  input gives it (read from the archive's opcodes, never unpickled).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from certify.device import choose_device
from certify.errors import ModelError
from certify.models import load_model

import builders

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.unit
def test_certify_installs_what_the_default_onnx_exporter_needs():
    text = (ROOT / "pyproject.toml").read_text()
    deps = text.split("dependencies = [", 1)[1].split("]", 1)[0]  # the base dependencies
    assert '"onnxscript>=' in deps, deps
    import onnxscript  # noqa: F401  (installed with certify, not only with the tests)


def test_a_second_models_run_into_the_first_ones_folder_names_a_new_one(model_path,
                                                                         clean_suite,
                                                                         npz_path, tmp_path):
    out = tmp_path / "certify-run"
    args = ("--suite", clean_suite, "--data", npz_path, "--out", out, "--no-pdf", "--quiet")
    assert builders.run_cli("run", model_path, *args).returncode in (0, 1, 6, 7)
    (tmp_path / "certify-run-2").mkdir()  # taken too
    other = builders.export(builders.make_net(seed=1), tmp_path / "other.onnx")
    proc = builders.run_cli("run", other, *args)
    assert proc.returncode == 2 and "already holds a run" in proc.stderr
    assert f"--out {tmp_path / 'certify-run-3'}" in proc.stderr, proc.stderr
    proc = builders.run_cli("run", other, *args, "--resume")
    assert proc.returncode == 2 and "differ from the interrupted run" in proc.stderr
    assert f"--out {tmp_path / 'certify-run-3'}" in proc.stderr, proc.stderr


def test_init_prints_its_run_line_with_an_out_folder(model_path, npz_path, tmp_path,
                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    proc = builders.run_cli("init", model_path, "--data", npz_path, "--out", "suite.yaml")
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("next: certify run"))
    assert line.endswith(f"--out certify-run-{Path(model_path).stem}"), line


def _saved(net: torch.nn.Module, folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    x = torch.rand(1, 3, 32, 32)
    out = {"pt2": folder / "b1.pt2", "traced": folder / "traced.pt",
           "scripted": folder / "scripted.pt"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.export.save(torch.export.export(net, (x,)), str(out["pt2"]))
        torch.jit.save(torch.jit.trace(net, x), str(out["traced"]))
        torch.jit.save(torch.jit.script(net), str(out["scripted"]))
    return out


def test_a_pt2_at_batch_1_says_so_and_a_traced_program_needs_no_input_size(net, tmp_path):
    files = _saved(net, tmp_path)
    cpu = choose_device("cpu")
    pt2 = load_model(str(files["pt2"]), cpu)
    assert pt2.info.batch.startswith("exported at batch 1 (run batched"), pt2.info.batch
    traced = load_model(str(files["traced"]), cpu)  # no input_size: the trace's example
    assert traced.info.input_shape == (3, 32, 32)
    x = torch.rand(4, 3, 32, 32)
    assert torch.allclose(traced.predict(x), net(x).detach(), atol=1e-5)
    with pytest.raises(ModelError, match="holds no traced example input"):
        load_model(str(files["scripted"]), cpu)  # scripted: nothing states the size
