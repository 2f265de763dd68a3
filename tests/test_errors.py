"""Bad inputs exit 2 or 3 with one clear line and no traceback."""

from __future__ import annotations

import warnings

import pytest
import torch

import builders

pytestmark = pytest.mark.e2e


def _one_clear_line(proc, code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def _refused_before_run(proc, out, code: int, *needles: str) -> None:
    """One clear line, and a failed pre-check leaves no --out folder behind."""
    _one_clear_line(proc, code, *needles)
    assert not out.exists(), sorted(p.name for p in out.iterdir())


def test_corrupt_onnx(tmp_path, official_dir):
    bad = tmp_path / "corrupt.onnx"
    good = builders.export(builders.make_net(), tmp_path / "good.onnx").read_bytes()
    bad.write_bytes(good[: len(good) // 3])
    proc = builders.run_cli("run", bad, "--suite", "gtsrb", "--data", official_dir,
                            "--out", tmp_path / "o")
    _refused_before_run(proc, tmp_path / "o", 3, "corrupt.onnx")


def test_garbage_file(tmp_path, official_dir):
    bad = tmp_path / "garbage.onnx"
    bad.write_bytes(b"\x00\xff" * 1000)
    proc = builders.run_cli("run", bad, "--suite", "gtsrb", "--data", official_dir,
                            "--out", tmp_path / "o")
    _refused_before_run(proc, tmp_path / "o", 3, "garbage.onnx")


def test_missing_model(tmp_path, official_dir):
    proc = builders.run_cli("run", tmp_path / "nope.onnx", "--suite", "gtsrb", "--data",
                            official_dir, "--out", tmp_path / "o")
    _refused_before_run(proc, tmp_path / "o", 3, "not found")


def test_model_input_not_an_image(tmp_path, official_dir):
    path = tmp_path / "tabular.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch.nn.Linear(10, 43), (torch.rand(1, 10),), str(path),
                          input_names=["features"], dynamo=False,
                          dynamic_axes={"features": {0: "n"}})
    proc = builders.run_cli("run", path, "--suite", "gtsrb", "--data", official_dir,
                            "--out", tmp_path / "o")
    _refused_before_run(proc, tmp_path / "o", 3, "not an image")


def test_wrong_number_of_classes(tmp_path, official_dir):
    torch.manual_seed(0)
    net = builders.TinyNet(num_classes=10).eval()
    model = builders.export(net, tmp_path / "ten.onnx")
    proc = builders.run_cli("run", model, "--suite", "gtsrb", "--data", official_dir,
                            "--out", tmp_path / "o")
    _refused_before_run(proc, tmp_path / "o", 2, "10 scores", "43 classes")


def test_missing_data_folder(model_path, tmp_path):
    proc = builders.run_cli("run", model_path, "--suite", "gtsrb", "--data",
                            tmp_path / "no-such-dir", "--out", tmp_path / "o")
    _refused_before_run(proc, tmp_path / "o", 2, "no-such-dir")


def test_no_data_given(model_path, tmp_path):
    proc = builders.run_cli("run", model_path, "--suite", "gtsrb", "--out", tmp_path / "o")
    _refused_before_run(proc, tmp_path / "o", 2, "no data")


def test_csv_with_malformed_row(model_path, dataset_arrays, tmp_path):
    x, y = dataset_arrays
    root = builders.write_gtsrb_csv(tmp_path / "d", x[:10], y[:10])
    csv = root / "Test.csv"
    lines = csv.read_text().splitlines()
    lines[4] = "36,36,2,2"  # row 5 of the file lost its tail
    csv.write_text("\n".join(lines) + "\n")
    proc = builders.run_cli("run", model_path, "--suite", "gtsrb", "--data", root,
                            "--out", tmp_path / "o")
    _refused_before_run(proc, tmp_path / "o", 2, "Test.csv:5", "malformed row")


def test_csv_with_non_integer_label(model_path, dataset_arrays, tmp_path):
    x, y = dataset_arrays
    root = builders.write_gtsrb_official(tmp_path / "d", x[:10], y[:10])
    csv = root / "GT-final_test.csv"
    lines = csv.read_text().splitlines()
    lines[3] = lines[3].rsplit(";", 1)[0] + ";stop"
    csv.write_text("\n".join(lines) + "\n")
    proc = builders.run_cli("run", model_path, "--suite", "gtsrb", "--data", root,
                            "--out", tmp_path / "o")
    _refused_before_run(proc, tmp_path / "o", 2, "GT-final_test.csv:4", "ClassId")


def test_label_out_of_range_and_missing_image(model_path, dataset_arrays, tmp_path):
    x, y = dataset_arrays
    root = builders.write_gtsrb_official(tmp_path / "d", x[:10], y[:10])
    csv = root / "GT-final_test.csv"
    lines = csv.read_text().splitlines()
    lines[2] = lines[2].rsplit(";", 1)[0] + ";99"
    csv.write_text("\n".join(lines) + "\n")
    proc = builders.run_cli("run", model_path, "--suite", "gtsrb", "--data", root,
                            "--out", tmp_path / "o")
    _refused_before_run(proc, tmp_path / "o", 2, "GT-final_test.csv:3", "label 99")

    root2 = builders.write_gtsrb_official(tmp_path / "d2", x[:10], y[:10])
    (root2 / "00004.ppm").unlink()
    proc = builders.run_cli("run", model_path, "--suite", "gtsrb", "--data", root2,
                            "--out", tmp_path / "o2")
    _refused_before_run(proc, tmp_path / "o2", 2, "00004.ppm")

    root3 = builders.write_gtsrb_official(tmp_path / "d3", x[:10], y[:10])
    (root3 / "00002.ppm").write_bytes(b"not an image")
    proc = builders.run_cli("run", model_path, "--suite", "gtsrb", "--data", root3,
                            "--out", tmp_path / "o3")
    _refused_before_run(proc, tmp_path / "o3", 2, "00002.ppm", "unreadable")


def _suite_text() -> str:
    from certify.suite import resolve_suite_path

    return resolve_suite_path("gtsrb").read_text()


@pytest.mark.parametrize(
    ("old", "new", "needles"),
    [
        ("checks:", "chekcs:", ("chekcs", "valid keys")),
        ("interpolation: bilinear", "interpolaton: bilinear", ("interpolaton", "valid keys")),
        ("kind: clean_accuracy", "kind: clean_acc", ("clean_acc", "valid kinds")),
        ("threshold: {metric: accuracy, min: 0.9}", "threshold: {metric: acc, min: 0.9}",
         ("acc", "valid metrics")),
        ("seed: 0", "seed: [0", ("not valid YAML",)),
    ],
)
def test_suite_file_errors(old, new, needles, model_path, official_dir, tmp_path):
    text = _suite_text()
    assert old in text
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace(old, new, 1))
    proc = builders.run_cli("run", model_path, "--suite", path, "--data", official_dir,
                            "--out", tmp_path / "o")
    _refused_before_run(proc, tmp_path / "o", 2, *needles)


def test_unknown_suite_name(model_path, tmp_path):
    proc = builders.run_cli("run", model_path, "--suite", "imagenet", "--out", tmp_path / "o")
    _refused_before_run(proc, tmp_path / "o", 2, "imagenet")
    assert "gtsrb" in proc.stderr


def test_existing_run_dir_needs_resume(model_path, official_dir, clean_suite, tmp_path):
    out = tmp_path / "o"
    args = ("run", model_path, "--suite", clean_suite, "--data", official_dir, "--out", out,
            "--no-pdf", "--samples", "20")
    assert builders.run_cli(*args).returncode == 1
    _one_clear_line(builders.run_cli(*args), 2, "already holds a run")


def test_resume_with_other_seed_is_refused(model_path, official_dir, clean_suite, tmp_path):
    out = tmp_path / "o"
    args = ["run", model_path, "--suite", clean_suite, "--data", official_dir, "--out", out,
            "--no-pdf", "--samples", "20"]
    assert builders.run_cli(*args).returncode == 1
    _one_clear_line(builders.run_cli(*args, "--resume", "--seed", "5"), 2, "cannot resume")


def test_usage_error_exit_code(tmp_path):
    proc = builders.run_cli("run", "--suite", "gtsrb")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


def test_version_and_help():
    proc = builders.run_cli("--version")
    assert proc.returncode == 0 and "certify" in proc.stdout
    proc = builders.run_cli("run", "--help")
    assert proc.returncode == 0 and "Example" in proc.stdout


def test_suites_list_and_show():
    proc = builders.run_cli("suites", "list")
    assert proc.returncode == 0 and "gtsrb" in proc.stdout
    proc = builders.run_cli("suites", "show", "gtsrb")
    assert proc.returncode == 0 and "clean_accuracy" in proc.stdout


def test_every_option_of_every_command_has_help_and_no_doubled_percent():
    """Issue 30 point 6: `--help` explains every option, and click (which does no %-formatting)
    shows no "%%"."""
    import click

    from certify.cli import main

    missing, doubled = [], []

    def walk(cmd: click.Command, path: list[str]) -> None:
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden and p.name != "help":
                if not p.help:
                    missing.append(f"{' '.join(path)} {p.opts[0]}")
                elif "%%" in p.help:
                    doubled.append(f"{' '.join(path)} {p.opts[0]}")
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])

    walk(main, ["certify"])
    assert not missing, missing
    assert not doubled, doubled


@pytest.mark.parametrize("args", [("suites", "show", "gtsrb"), ("suites", "list"),
                                  ("run", "--help")])
def test_a_reader_that_went_away_does_not_change_the_exit_code(args):
    """Issue 30 point 6: ``certify suites show gtsrb | true`` exits 0, like the command; the
    closed pipe is not an error (it was exit 1, silently)."""
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).parent / "certify"
    proc = subprocess.Popen([str(exe), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line is written
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "error" not in err.lower(), err


def test_without_a_terminal_progress_prints_lines_with_an_eta(monkeypatch):
    """Issue 30 point 6: in a CI log (no terminal) rich would draw the bars only at the end;
    a plain line with progress and ETA comes at the start and every LINE_EVERY_S seconds,
    even while one long batch runs."""
    import io
    import time

    from rich.console import Console

    from certify.cli import RichProgress

    monkeypatch.setattr(RichProgress, "LINE_EVERY_S", 0.2)
    buf = io.StringIO()
    with RichProgress(Console(file=buf, force_terminal=False, width=200), enabled=True) as p:
        p.start("square_linf", 100)
        p.advance(25)
        time.sleep(1.3)  # a long batch: the timer still reports
        p.advance(25)
        p.finish()
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("square_linf: 0/100 samples (0%)")
    ticks = [ln for ln in lines if ln.startswith("square_linf: 25/100 samples (25%)")]
    assert len(ticks) >= 3 and all("ETA" in ln and "samples/s" in ln for ln in ticks), lines
    assert lines[-1].startswith("square_linf: 50/100 samples (50%)")
    # with a terminal, the bar itself and no plain lines
    buf = io.StringIO()
    with RichProgress(Console(file=buf, force_terminal=True, width=200), enabled=True) as p:
        p.start("square_linf", 10)
        p.advance(10)
        p.finish()
    assert "samples (" not in buf.getvalue()
