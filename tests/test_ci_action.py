"""The GitHub Action (issue 18 point 2): action.yml and the release check it runs, end to end
without GitHub (``python -m certify.ci_action`` with GitHub's variables pointed at files)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import builders

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup(net, model_path, tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("action")
    suite = builders.write_small_suite(tmp / "suite.yaml", "rel")
    keys = tmp / "keys"
    assert builders.run_cli("keygen", "--out", keys).returncode == 0
    return {"tmp": tmp, "suite": suite, "model": model_path, "keys": keys,
            "data": builders.write_labelled_npz(net, tmp / "d.npz", 100, seed=11),
            "other": builders.write_labelled_npz(net, tmp / "o.npz", 100, seed=12),
            "weak": builders.export(builders.make_net(seed=1), tmp / "weak.onnx")}


def _check(s: dict[str, Path], name: str, previous: str | Path, *, model: Path | None = None,
           data: Path | None = None, extra: dict[str, str] | None = None
           ) -> tuple[subprocess.CompletedProcess[str], str, dict[str, str], Path]:
    """Run the release check as the action's step does; returns the process, the job
    summary, the step outputs and the card folder."""
    work = s["tmp"] / name
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GITHUB_", "CERTIFY_")) and k != "GH_TOKEN"}
    env.update({
        "CERTIFY_MODEL": str(model or s["model"]), "CERTIFY_SUITE": str(s["suite"]),
        "CERTIFY_DATA": str(data or s["data"]), "CERTIFY_PREVIOUS_CARD": str(previous),
        "CERTIFY_OUT": str(work / "card"), "CERTIFY_PDF": "false",
        "CERTIFY_SIGNING_KEY": (s["keys"] / "certify.key").read_text(),
        "CERTIFY_PUBKEY": str(s["keys"] / "certify.pub"), "CERTIFY_RELEASE_TAG": "v1.0",
        "GITHUB_STEP_SUMMARY": str(work / "step-summary.md"),
        "GITHUB_OUTPUT": str(work / "github-output"),
        **(extra or {}),
    })
    proc = subprocess.run([sys.executable, "-m", "certify.ci_action"], capture_output=True,
                          text=True, env=env, timeout=300, cwd=work)
    summary = (work / "step-summary.md").read_text(encoding="utf-8")
    outputs = dict(line.split("=", 1) for line in
                   (work / "github-output").read_text().splitlines())
    return proc, summary, outputs, work / "card"


@pytest.fixture(scope="module")
def first(setup):
    return _check(setup, "first", "none")


def test_first_release_has_nothing_to_compare_and_does_not_fail(first):
    proc, summary, outputs, card = first
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing to compare" in summary and "first card" in summary
    assert outputs["comparison"] == "none" and outputs["exit-code"] == "0"
    assert outputs["verdict"] == "PASS" and "signed" in summary and "not signed" not in summary
    assert (card / "results.json.sig").is_file() and (card / "model-index.md").is_file()
    # the signing key is never left on disk next to the card, nor in the summary
    assert not list(card.parent.rglob("*.key")) and "PRIVATE KEY" not in summary
    # no GH token: nothing is attached, and the summary says so plainly
    assert "Not attached to release v1.0: no token" in summary
    assert (card / "job-summary.md").read_text(encoding="utf-8") == summary


def test_the_same_model_again_has_no_resolved_regression(setup, first):
    proc, summary, outputs, card = _check(setup, "again", first[3] / "card.html")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert outputs["comparison"] == "ok" and outputs["regressions"] == ""
    assert "No resolved regression" in summary
    assert re.search(r"\| clean \| .* \| no change \|", summary), summary
    assert (card / "compare.html").is_file() and (card / "compare.json").is_file()


def test_a_much_weaker_model_fails_the_job_naming_the_check_and_attaches_both_cards(
        setup, first, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "gh.log"
    gh = bin_dir / "gh"
    gh.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\necho "token=$GH_TOKEN" >> "{log}"\n')
    gh.chmod(0o755)
    extra = {"GH_TOKEN": "t0ken", "GITHUB_REPOSITORY": "o/r",
             "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc, summary, outputs, card = _check(setup, "weak", first[3], model=setup["weak"],
                                          extra=extra)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert outputs["comparison"] == "regression" and "clean" in outputs["regressions"]
    assert "Resolved regression" in summary and "**clean**" in summary
    assert re.search(r"\| clean \| .* \| regression \|", summary), summary
    calls = log.read_text()
    assert calls.startswith("release upload v1.0 ") and "--repo o/r" in calls
    assert "token=t0ken" in calls
    for name in ("card.html", "results.json", "results.json.sig", "compare.html",
                 "compare.json", "model-index.md"):
        assert str(card / name) in calls
    assert "Attached to release v1.0" in summary


def test_a_card_on_other_data_is_not_comparable_and_says_why(setup, first):
    proc, summary, outputs, _ = _check(setup, "other", first[3] / "results.json",
                                       data=setup["other"])
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert outputs["comparison"] == "not comparable"
    assert "Not comparable" in summary and "data digest differs" in summary


def test_a_missing_previous_card_stops_with_a_usage_error(setup):
    proc, summary, outputs, _ = _check(setup, "missing", setup["tmp"] / "nope" / "card.pdf")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "previous card" in summary and "not found" in summary
    assert outputs["exit-code"] == "2"



def test_fail_on_verdict_fails_the_job_on_a_failed_card_even_with_nothing_to_compare(setup):
    strict = setup["tmp"] / "strict.yaml"
    raw = yaml.safe_load(setup["suite"].read_text())
    raw["checks"] = [{**raw["checks"][0], "threshold": {"metric": "accuracy", "min": 0.99}}]
    strict.write_text(yaml.safe_dump(raw))
    proc, summary, outputs, _ = _check({**setup, "suite": strict}, "strict", "none",
                                       extra={"CERTIFY_FAIL_ON": "verdict"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert outputs["verdict"] == "FAIL" and outputs["run-exit-code"] == "1"
    assert "nothing to compare" in summary and "fails on the card's verdict" in summary

# --- action.yml ------------------------------------------------------------------------------


def test_action_yml_is_a_composite_action_whose_steps_use_only_declared_inputs():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    inputs = action["inputs"]
    assert {"model", "suite", "data", "previous-card", "signing-key", "output-dir",
            "tolerance", "python-version", "github-token"} <= set(inputs)
    assert inputs["model"]["required"] is True
    steps = action["runs"]["steps"]
    text = yaml.safe_dump(action)
    used = set(re.findall(r"inputs\.([A-Za-z0-9_-]+)", text))
    assert used and used <= set(inputs), used - set(inputs)
    for step in steps:
        assert "uses" in step or step.get("shell") == "bash", step
    # outputs come from the step that writes GITHUB_OUTPUT
    ids = {s.get("id") for s in steps}
    for out in action["outputs"].values():
        step_id = re.search(r"steps\.([\w-]+)\.outputs", out["value"])
        assert step_id and step_id[1] in ids
    # the script the action runs exists, and every CERTIFY_ variable it is given is an input
    from certify.ci_action import INPUTS

    runs = [s["run"] for s in steps if "run" in s]
    assert any("-m certify.ci_action" in r for r in runs)
    assert (ROOT / "certify" / "ci_action.py").is_file()
    env = next(s["env"] for s in steps if "-m certify.ci_action" in s.get("run", ""))
    assert {k for k in env if k.startswith("CERTIFY_")} == set(INPUTS)
    # the signing key reaches the script only through the environment, never the command line
    assert "signing-key" not in " ".join(runs)


def test_the_source_url_is_the_release_asset_only_when_the_cards_will_be_attached():
    from certify.ci_action import release_asset_url

    env = {"GITHUB_REPOSITORY": "o/r", "GH_TOKEN": "t"}
    assert release_asset_url(env, "v2", "card.pdf") == \
        "https://github.com/o/r/releases/download/v2/card.pdf"
    assert release_asset_url({**env, "GITHUB_SERVER_URL": "https://ghe.example"}, "v2",
                             "card.pdf") == "https://ghe.example/o/r/releases/download/v2/card.pdf"
    assert release_asset_url(env, "", "card.pdf") is None
    assert release_asset_url({"GITHUB_REPOSITORY": "o/r"}, "v2", "card.pdf") is None


def test_a_previous_card_url_is_downloaded_and_a_missing_one_is_a_usage_error(first, tmp_path):
    import functools
    import http.server
    import threading

    from certify.ci_action import fetch_previous
    from certify.errors import UsageError

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(first[3]))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        got = fetch_previous(f"{base}/card.html", tmp_path / "prev")
        assert got == tmp_path / "prev" / "card.html"
        assert got.read_bytes() == (first[3] / "card.html").read_bytes()
        with pytest.raises(UsageError, match="HTTP 404"):
            fetch_previous(f"{base}/gone/card.pdf", tmp_path / "prev2")
        with pytest.raises(UsageError, match="does not name a card"):
            fetch_previous(f"{base}/", tmp_path / "prev3")
    finally:
        server.shutdown()
        server.server_close()
    assert fetch_previous("none", tmp_path) is None and fetch_previous("", tmp_path) is None
