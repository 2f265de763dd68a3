"""What the console says at the end of a run (issue 41): every row's warnings, counts of the
rows that decide the verdict, what a resumed run reused, hints that are true of the run folder,
and a start-up that does not import torch for --version or --help."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import builders

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def attack_suite(tmp_path_factory) -> Path:
    """Clean accuracy and two small L-inf attacks on the tiny model: one threat model decided
    by two attack rows, and a black-box attack below its query floor (so a warning) on the
    samples a one-step APGD (which runs first) left unbroken."""
    checks = [
        {"id": "clean", "kind": "clean_accuracy", "threshold": {"metric": "accuracy", "min": 0.0}},
        {"id": "square_linf", "kind": "attack", "samples": 12,
         "params": {"attack": "square_linf", "epsilon": 0.0314, "max_queries": "auto",
                    "initial_queries": 20, "query_cap": 40, "confident_queries": 10,
                    "binarization": False},
         "threshold": {"metric": "robust_accuracy", "min": 0.0}},
        {"id": "apgd_linf", "kind": "attack", "samples": 12,
         "params": {"attack": "apgd_ce", "norm": "linf", "epsilon": 0.0314,
                    "attack_params": {"iterations": 1, "restarts": 1},
                    "binarization": {"samples": 2}},
         "threshold": {"metric": "robust_accuracy", "min": 0.0}},
    ]
    path = tmp_path_factory.mktemp("console") / "attacks.yaml"
    path.write_text(yaml.safe_dump({"name": "console", "classes": builders.CLASSES, "seed": 0,
                                    "checks": checks}))
    return path


@pytest.fixture(scope="module")
def attack_run(model_path, npz_path, attack_suite, tmp_path_factory):
    out = tmp_path_factory.mktemp("console-run") / "run"
    proc = builders.run_cli("run", model_path, "--suite", attack_suite, "--data", npz_path,
                            "--out", out, "--no-pdf")
    assert proc.returncode in (0, 7), proc.stderr  # PASS or WARN: thresholds at 0
    return out, proc


def test_the_summary_prints_every_rows_warnings(attack_run):
    out, proc = attack_run
    r = json.loads((out / "results.json").read_text())["measurement"]
    expected = [f"warning: {c['id']}: {w}" for c in r["checks"] for w in c["warnings"]]
    expected += [w for t in r["attack_worst_case"] for w in t["warnings"]]
    assert any(c["warnings"] for c in r["checks"])  # the below-floor square row warns
    lines = proc.stdout.splitlines()
    verdict = next(i for i, ln in enumerate(lines) if ln.startswith("verdict: "))
    for text in expected:  # one line each, after the verdict
        assert any(text in ln and ln.startswith("warning: ") for ln in lines[verdict:]), text


def test_the_headline_counts_the_threat_model_row_for_its_attack_rows(attack_run):
    out, proc = attack_run
    r = json.loads((out / "results.json").read_text())["measurement"]
    (threat,) = r["attack_worst_case"]
    assert sorted(threat["attacks"]) == ["apgd_linf", "square_linf"]
    deciding = [r["checks"][0]["status"], threat["status"]]  # clean, and the threat model
    words = {"PASS": "passed", "WARN": "passed with a warning (WARN)", "FAIL": "failed",
             "INFO": "informational",
             "INCONCLUSIVE": "inconclusive"}
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("verdict: "))
    for status in set(deciding):
        assert f"{deciding.count(status)} {words[status]}" in line, line
    assert "1 threat model counted in place of the 2 attack rows it decides" in line
    assert sum(r["summary"].values()) == 3  # the signed summary still counts every check row
    card = (out / "card.html").read_text()
    (counts,) = re.findall(r'<span class="counts"[^>]*>\((.*?)\)</span>', card, flags=re.S)
    assert sum(int(n) for n in re.findall(r"(\d+) (?:passed with a warning \(WARN\)|passed|"
                                          r"failed|inconclusive|errored|informational)",
                                          counts)) == 2
    # the console's warning lines and the card's count of warnings agree (issue 62)
    warned = [ln for ln in proc.stdout.splitlines() if ln.startswith("warning: ")]
    n = len(warned)
    assert n and f"{n} warning{'s' if n != 1 else ''} on the rows" in counts, counts
    assert f"{n} warning{'s' if n != 1 else ''} on the rows (below)" in line
    # the headline keeps its length (the demo's first PDF page is full); the appendix's
    # decision rule says what the counts count
    assert "1 threat-model row in place of the 2 attack rows it summarises" in card


def test_a_resumed_run_says_what_it_reused_and_rates_only_new_samples(model_path, npz_path,
                                                                      clean_suite, tmp_path):
    out = tmp_path / "run"
    args = ("run", model_path, "--suite", clean_suite, "--data", npz_path, "--out", out,
            "--no-pdf")
    assert builders.run_cli(*args).returncode in (0, 1)
    records = out / "records.jsonl"
    lines = records.read_text().splitlines(keepends=True)
    records.write_text("".join(lines[:100]))  # as if stopped after 100 samples
    proc = builders.run_cli(*args, "--resume")
    assert proc.returncode in (0, 1), proc.stderr
    assert "resumed: reused 100 records from the earlier run" in proc.stdout
    last = [ln for ln in proc.stderr.splitlines() if ln.startswith("clean: ")][-1]
    assert f"{len(lines)}/{len(lines)} samples" in last
    assert "100 reused from the earlier run" in last and "samples/s" in last


def test_progress_leaves_reused_records_out_of_the_rate(monkeypatch):
    import io
    import time

    from rich.console import Console

    from certify.cli import RichProgress

    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    buf = io.StringIO()
    with RichProgress(Console(file=buf, force_terminal=False, width=200), enabled=True) as p:
        p.start("apgd_linf", 100)
        p.reuse(40)
        now[0] = 2.0
        p.advance(10)  # 10 new samples in 2 s
        p.finish()
    lines = buf.getvalue().splitlines()
    assert lines[1].startswith("apgd_linf: 40/100 samples (40%), 40 reused from the earlier "
                               "run, 0 s elapsed"), lines  # no rate before a new sample
    assert lines[-1].startswith("apgd_linf: 50/100 samples (50%), 40 reused from the earlier "
                                "run, 5.0 samples/s"), lines


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("before, says", [
    ("nothing", "nothing was written to {out}; rerun the same command"),
    ("run.json", "no sample was recorded in {out} yet; rerun with --resume"),
    ("records", "records are kept, rerun with --resume"),
])
def test_the_resume_hint_is_true_of_the_run_folder(before, says, clean_suite, npz_path,
                                                   tmp_path):
    out = tmp_path / "run"
    if before != "nothing":  # a run that stopped before (or after) its first record
        out.mkdir()
        (out / "run.json").write_text(json.dumps({"fingerprint": {}}))
        if before == "records":
            (out / "records.jsonl").write_text('{"check": "clean", "i": 0}\n')
    url = f"http://127.0.0.1:{_closed_port()}/v2/models/m"
    proc = builders.run_cli("run", url, "--suite", clean_suite, "--data", npz_path, "--out",
                            out, "--retries", "0", "-q",
                            *(["--resume"] if before != "nothing" else []))
    assert proc.returncode == 3, proc.stderr
    text = " ".join(proc.stderr.split())  # rich wraps the line
    assert says.format(out=out) in text, text
    assert (before == "records") == ("records are kept" in text)


def test_version_and_help_do_not_import_torch():
    """`certify --version` and `--help` answer in a fraction of a second: no torch, no
    onnxruntime, no library entry point at start-up."""
    code = ("import sys\nfrom certify.cli import main\n"
            "for args in (['--version'], ['--help'], ['run', '--help']):\n"
            "    try:\n        main(args)\n    except SystemExit as e:\n"
            "        assert e.code == 0, (args, e.code)\n"
            "heavy = ('torch', 'onnxruntime', 'numpy', 'certify.api', 'certify.results')\n"
            "print('LOADED', [m for m in heavy if m in sys.modules])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "certify, version" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "LOADED []", proc.stdout


def test_a_run_without_pdf_imports_no_weasyprint_and_reading_commands_no_engine(
        model_path, clean_suite, npz_path, tmp_path):
    """Issue 53: ``certify run --no-pdf`` never imports WeasyPrint (it did, for the version
    in provenance); ``compare`` and ``schema`` import neither torch nor WeasyPrint (nor
    onnxruntime, matplotlib or the checks), in a fresh interpreter as a user starts them."""
    out = tmp_path / "run"
    loaded, said = builders.loaded_after([["run", str(model_path), "--suite", str(clean_suite),
                                           "--data", str(npz_path), "--out", str(out),
                                           "--no-pdf", "-q"]], ("weasyprint", "pydyf", "torch"))
    assert (out / "card.html").is_file() and not (out / "card.pdf").exists(), said
    assert loaded == ["torch"], said  # the run needs torch, and never the PDF renderer
    heavy = ("torch", "onnxruntime", "weasyprint", "matplotlib", "certify.engine",
             "certify.checks")
    results = str(out / "results.json")
    loaded, said = builders.loaded_after([["compare", results, results], ["schema"]], heavy)
    assert "EXIT compare 0" in said and loaded == [], said


def test_suites_reading_commands_and_inits_refusals_import_no_heavy_library(
        model_path, clean_suite, npz_path, tmp_path):
    """Issue 53: nothing imported that a command does not use. ``suites list`` and ``suites
    show`` (which validate every check, attacks and corruptions included), ``export``,
    ``compare``, ``verify``, ``schema`` and ``init`` up to its first message (a refusal before
    any model is loaded) import none of torch, onnxruntime, kornia, WeasyPrint or matplotlib,
    in a fresh interpreter as a user starts them."""
    keys = tmp_path / "keys"
    assert builders.run_cli("keygen", "--out", keys).returncode == 0
    out = tmp_path / "run"
    proc = builders.run_cli("run", model_path, "--suite", clean_suite, "--data", npz_path,
                            "--out", out, "--no-pdf", "-q", "--sign-key", keys / "certify.key")
    assert proc.returncode in (0, 1) and (out / "results.json.sig").is_file(), proc.stderr
    results = str(out / "results.json")
    commands = [["suites", "list"], ["suites", "show", "gtsrb"],
                ["suites", "show", "image-classification"], ["export", str(out)],
                ["compare", results, results],
                ["verify", str(out / "card.html"), "--pubkey", str(keys / "certify.pub")],
                ["schema"],
                ["init", str(model_path), "--data", str(tmp_path / "missing"), "--out",
                 str(tmp_path / "suite.yaml")]]
    heavy = ("torch", "onnxruntime", "kornia", "weasyprint", "matplotlib")
    loaded, said = builders.loaded_after(commands, heavy)
    exits = re.findall(r"^EXIT (\S+) (\S+)$", said, flags=re.M)
    assert [code for _, code in exits] == ["0"] * 7 + ["2"], said
    assert "gtsrb" in said and "data path not found" in said, said
    assert (out / "model-index.md").is_file(), said
    assert loaded == [], said
