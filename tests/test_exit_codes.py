"""One exit-code table for every command (certify.errors.EXIT_CODES), tested command by command.

Real runs use the tiny model and a 40-image .npz; verdicts the runner cannot produce cheaply
(INCONCLUSIVE) and crashes are driven in-process with the library call replaced.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

import certify.api
import certify.cli
from certify import errors
from certify.errors import (
    CARD_WRITTEN_CODES,
    EXIT_CODES,
    EXIT_ERROR,
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_MODEL,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_WARN,
    VERDICT_PRECEDENCE,
    VerificationError,
    exit_code_for_verdict,
    overall_verdict,
)

import builders

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
CLASSES = [f"c{i}" for i in range(builders.NUM_CLASSES)]
PASSING = {"id": "clean", "kind": "clean_accuracy",
           "threshold": {"metric": "accuracy", "min": 0.0}}
# the labels are 10% wrong by construction: no model reaches 99%
FAILING = {"id": "clean_strict", "kind": "clean_accuracy",
           "threshold": {"metric": "accuracy", "min": 0.99}}
ERRORING = {"id": "clean_starved", "kind": "clean_accuracy", "budget": 1,
            "threshold": {"metric": "accuracy", "min": 0.0}}
WARNING = {"id": "sanity", "kind": "sanity"}  # warns on a model that returns probabilities
# about 90% of 40 right: the 95% interval (77-96%) straddles 0.85, so the interval rule cannot
# decide it (INCONCLUSIVE) where the point estimate passes
UNDECIDED = {"id": "clean_close", "kind": "clean_accuracy",
             "threshold": {"metric": "accuracy", "min": 0.85}}


# --- the table itself --------------------------------------------------------------------------

def test_every_error_class_maps_to_a_code_of_the_table():
    classes = [c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, errors.CertifyError)]
    assert len(classes) >= 6
    for cls in [*classes, VerificationError]:
        assert cls.exit_code in EXIT_CODES, cls
    assert VerificationError.exit_code == EXIT_FAIL
    assert errors.ModelError.exit_code == EXIT_MODEL
    assert {errors.UsageError.exit_code, errors.SuiteError.exit_code,
            errors.DataError.exit_code} == {EXIT_USAGE}


def test_verdicts_map_to_distinct_codes_in_precedence_order():
    codes = [exit_code_for_verdict(v) for v in VERDICT_PRECEDENCE]
    assert len(set(codes)) == len(codes)
    assert codes[-1] == EXIT_OK and all(c != EXIT_OK for c in codes[:-1])
    assert exit_code_for_verdict("INFO") == EXIT_OK
    with pytest.raises(ValueError, match="unknown verdict"):
        exit_code_for_verdict("MAYBE")


@pytest.mark.parametrize("statuses, verdict", [
    ([], "PASS"),
    (["INFO", "PASS"], "PASS"),
    (["PASS", "WARN"], "WARN"),
    (["WARN", "INCONCLUSIVE", "PASS"], "INCONCLUSIVE"),
    (["INCONCLUSIVE", "FAIL", "WARN"], "FAIL"),
    (["FAIL", "ERROR", "INCONCLUSIVE", "WARN", "PASS"], "ERROR"),
])
def test_the_most_severe_verdict_wins(statuses, verdict):
    assert overall_verdict(statuses) == verdict
    assert overall_verdict(reversed(statuses)) == verdict


def test_unknown_status_is_refused():
    with pytest.raises(ValueError, match="unknown check status"):
        overall_verdict(["PASS", "OK"])


def test_docs_and_cli_document_the_same_table():
    """The documentation's exit-code page shows the table generated from EXIT_CODES, and its
    hand-written details name every code; the CLI's docstring and --help say the same."""
    page = (ROOT / "docs" / "reference" / "exit-codes.md").read_text()
    assert "```{include} ../_generated/exit-codes.md" in page
    section = builders.docs_extension().exit_codes_reference()
    documented = {int(c) for c in re.findall(r"^\| (\d+) \|", section, flags=re.M)}
    assert documented == set(EXIT_CODES)
    assert " > ".join(VERDICT_PRECEDENCE) in section
    details = page.split("## In more detail", 1)[1]
    assert {int(c) for c in re.findall(r"\*\*(\d+)\*\*", details)} == set(EXIT_CODES)
    doc = certify.cli.__doc__ or ""
    assert {int(c) for c in re.findall(r"^(\d+) ", doc, flags=re.M)} == set(EXIT_CODES)
    assert " > ".join(VERDICT_PRECEDENCE) in doc
    workflow = (ROOT / "docs" / "github-actions.md").read_text()
    (accepted,) = re.findall(r'case "\$rc" in ([\d|]+)\)', workflow)
    assert {int(c) for c in accepted.split("|")} == CARD_WRITTEN_CODES
    help_text = builders.run_cli("--help").stdout
    assert all(re.search(rf"^\s+{code}\s", help_text, flags=re.M) for code in EXIT_CODES)


# --- run: verdict -> code, in-process for every verdict ----------------------------------------

def _invoke(*args: str):
    return CliRunner().invoke(certify.cli.main, list(args))


def _result(verdict: str) -> SimpleNamespace:
    """Stands in for a RunResult: the CLI reads the verdict, the checks, the threat-model
    rows and the resumed records."""
    return SimpleNamespace(measurement=SimpleNamespace(verdict=verdict, attack_worst_case=[]),
                           checks=[], provenance=SimpleNamespace(timings={}))


@pytest.mark.parametrize("verdict, code", [
    ("PASS", EXIT_OK), ("WARN", EXIT_WARN), ("INCONCLUSIVE", EXIT_INCONCLUSIVE),
    ("FAIL", EXIT_FAIL), ("ERROR", EXIT_ERROR),
])
def test_run_exit_code_follows_the_verdict(verdict, code, monkeypatch, tmp_path):
    monkeypatch.setattr(certify.api, "certify_model",
                        lambda opts, progress: (_result(verdict), {}))
    result = _invoke("run", "m.onnx", "--suite", "s", "--out", str(tmp_path / "o"), "-q")
    assert result.exit_code == code, result.output


def test_demo_exits_0_whatever_the_verdict(monkeypatch, tmp_path):
    monkeypatch.setattr(certify.api, "run_demo",
                        lambda *a, **k: (_result("FAIL"), {}))
    assert _invoke("demo", "--out", str(tmp_path / "d"), "-q").exit_code == EXIT_OK


@pytest.mark.parametrize("exc, code", [
    (KeyboardInterrupt(), EXIT_INTERRUPTED),
    (RuntimeError("boom"), EXIT_INTERNAL),
    (errors.ModelError("gone"), EXIT_MODEL),
    (errors.DataError("bad"), EXIT_USAGE),
])
def test_run_exit_code_for_interrupts_crashes_and_errors(exc, code, monkeypatch, tmp_path):
    def raise_(opts, progress):
        raise exc

    monkeypatch.setattr(certify.api, "certify_model", raise_)
    result = _invoke("run", "m.onnx", "--suite", "s", "--out", str(tmp_path / "o"), "-q")
    assert result.exit_code == code, result.output


# --- run: real runs, precedence among real verdicts ---------------------------------------------

@pytest.fixture(scope="module")
def data(net, tmp_path_factory) -> Path:
    return builders.write_labelled_npz(net, tmp_path_factory.mktemp("codes") / "d.npz", 40,
                                       seed=21)


@pytest.fixture(scope="module")
def probs_model(net, tmp_path_factory) -> Path:
    return builders.export(net, tmp_path_factory.mktemp("probs") / "probs.onnx", probs=True)


def _suite(folder: Path, *checks: dict) -> Path:
    path = folder / f"suite-{len(list(folder.glob('suite-*')))}.yaml"
    path.write_text(yaml.safe_dump({"name": "codes", "classes": CLASSES, "seed": 2,
                                    "checks": list(checks)}))
    return path


def _run(model: Path, suite: Path, data: Path, out: Path, *extra: str):
    return builders.run_cli("run", model, "--suite", suite, "--data", data, "--out", out,
                            "--no-pdf", *extra)


@pytest.mark.parametrize("checks, verdict, code", [
    ([PASSING], "PASS", EXIT_OK),
    ([WARNING, PASSING], "WARN", EXIT_WARN),
    ([WARNING, FAILING], "FAIL", EXIT_FAIL),
    ([WARNING, FAILING, ERRORING], "ERROR", EXIT_ERROR),
    ([WARNING, UNDECIDED, PASSING], "INCONCLUSIVE", EXIT_INCONCLUSIVE),
    ([PASSING, {**UNDECIDED, "decision": "point"}], "PASS", EXIT_OK),
])
def test_run_real_verdicts(checks, verdict, code, probs_model, data, tmp_path):
    out = tmp_path / "o"
    proc = _run(probs_model, _suite(tmp_path, *checks), data, out)
    assert proc.returncode == code, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["measurement"]["verdict"] == verdict
    assert (out / "card.html").is_file() and code in CARD_WRITTEN_CODES


def test_run_usage_and_model_errors(model_path, data, tmp_path):
    suite = _suite(tmp_path, PASSING)
    assert _run(tmp_path / "missing.onnx", suite, data, tmp_path / "a").returncode == EXIT_MODEL
    assert _run(model_path, suite, tmp_path / "missing.npz", tmp_path / "b").returncode \
        == EXIT_USAGE
    assert builders.run_cli("run", model_path).returncode == EXIT_USAGE  # no --suite


def test_the_installed_executable_exits_with_the_table_s_codes(data, tmp_path):
    """The console script itself (a new process, not click's test runner): a missing model and
    a missing option give their codes, with a one-line message and no traceback."""
    suite = _suite(tmp_path, PASSING)
    proc = builders.run_cli_process("run", tmp_path / "missing.onnx", "--suite", suite,
                                    "--data", data, "--out", tmp_path / "a", "--no-pdf")
    assert proc.returncode == EXIT_MODEL, proc.stderr
    assert "missing.onnx" in proc.stderr and "Traceback" not in proc.stderr
    proc = builders.run_cli_process("run", tmp_path / "missing.onnx")  # no --suite
    assert proc.returncode == EXIT_USAGE and "Traceback" not in proc.stderr, proc.stderr


# --- sign, verify, bundle, verify-bundle, export, keygen, suites, contact-sheet -----------------

@pytest.fixture(scope="module")
def signed(model_path, data, tmp_path_factory) -> dict[str, Path]:
    """A finished run with card.pdf, then signed by `certify sign`, and its key pair."""
    folder = tmp_path_factory.mktemp("signed")
    keys = folder / "keys"
    assert builders.run_cli("keygen", "--out", keys).returncode == EXIT_OK
    run = folder / "run"
    proc = builders.run_cli("run", model_path, "--suite", _suite(folder, PASSING), "--data", data,
                            "--out", run)
    assert proc.returncode == EXIT_OK, proc.stderr
    proc = builders.run_cli("sign", run, "--key", keys / "certify.key")
    assert proc.returncode == EXIT_OK, proc.stderr
    return {"run": run, "key": keys / "certify.key", "pub": keys / "certify.pub",
            "model": model_path}


def test_verify_codes(signed, tmp_path):
    run, pub = signed["run"], signed["pub"]
    assert builders.run_cli("verify", run / "results.json", "--pubkey", pub).returncode \
        == EXIT_OK
    tampered = tmp_path / "t"
    tampered.mkdir()
    shutil.copy(run / "results.json.sig", tampered / "results.json.sig")
    doc = json.loads((run / "results.json").read_text())
    m = doc["measurement"]
    m["verdict"] = "PASS" if m["verdict"] != "PASS" else "FAIL"
    (tampered / "results.json").write_text(json.dumps(doc))
    proc = builders.run_cli("verify", tampered / "results.json", "--pubkey", pub)
    assert proc.returncode == EXIT_FAIL, proc.stderr
    assert builders.run_cli("verify", tmp_path / "nope.json", "--pubkey", pub).returncode \
        == EXIT_USAGE
    assert builders.run_cli("verify", run / "results.json", "--pubkey",
                            run / "results.json").returncode == EXIT_USAGE


def test_sign_codes(signed, tmp_path):
    assert builders.run_cli("sign", tmp_path / "no-run", "--key", signed["key"]).returncode \
        == EXIT_USAGE
    assert builders.run_cli("sign", signed["run"], "--key", tmp_path / "no.key").returncode \
        == EXIT_USAGE


def test_bundle_and_verify_bundle_codes(signed, tmp_path):
    out = tmp_path / "bundle"
    proc = builders.run_cli("bundle", signed["run"], "--model", signed["model"], "--key",
                            signed["key"], "--out", out)
    assert proc.returncode == EXIT_OK, proc.stderr
    (signature,) = re.findall(r"^signature: (.+)$", proc.stdout, flags=re.M)
    assert builders.run_cli("bundle", signed["run"], "--model", signed["model"], "--key",
                            signed["key"], "--out", out).returncode == EXIT_USAGE  # exists
    verify = ("verify-bundle", out, "--signature", signature, "--pubkey", signed["pub"])
    assert builders.run_cli(*verify).returncode == EXIT_OK
    model_copy = out / signed["model"].name
    model_copy.write_bytes(model_copy.read_bytes() + b"\0")
    assert builders.run_cli(*verify).returncode == EXIT_FAIL
    assert builders.run_cli("verify-bundle", out, "--signature", tmp_path / "none.json",
                            "--pubkey", signed["pub"]).returncode == EXIT_USAGE


def test_export_keygen_suites_contact_sheet_codes(signed, tmp_path):
    assert builders.run_cli("export", signed["run"]).returncode == EXIT_OK
    assert builders.run_cli("export", tmp_path).returncode == EXIT_USAGE  # no results.json
    assert builders.run_cli("keygen", "--out", tmp_path).returncode == EXIT_OK
    assert builders.run_cli("keygen", "--out", tmp_path).returncode == EXIT_USAGE  # exists
    assert builders.run_cli("suites", "show", "no-such-suite").returncode == EXIT_USAGE
    assert builders.run_cli("contact-sheet", tmp_path / "s.jpg").returncode == EXIT_USAGE
    assert builders.run_cli("no-such-command").returncode == EXIT_USAGE
