"""The release check behind the GitHub Action (``action.yml``): ``python -m certify.ci_action``.

One run does everything the action does, so that it runs the same on a laptop as in a
workflow: ``certify run`` (signed when a key is given), ``certify export``, ``certify compare``
against the previous release's card (a path, an http(s) URL, or ``none`` for the first
release), a Markdown job summary, step outputs, and the upload of the card and the comparison
card to the release. Inputs are environment variables (``CERTIFY_*``, listed in
:data:`INPUTS`); the GitHub-only parts are behind GitHub's own variables and are skipped,
saying so, when those are unset:

- ``GITHUB_STEP_SUMMARY``: the file the job summary is appended to (it is always written to
  ``<out>/job-summary.md`` as well);
- ``GITHUB_OUTPUT``: the file step outputs are appended to;
- ``GH_TOKEN`` with ``CERTIFY_RELEASE_TAG``: ``gh release upload`` of the cards (``gh`` from
  ``PATH``; ``GITHUB_REPOSITORY`` names the repository).

Exit code: 0 when every threat model and check with a threshold is unchanged or non-inferior
within the tolerance (and, with ``CERTIFY_FAIL_ON=verdict``, the card's verdict is PASS); 1 a
resolved regression on such a row; 6 neither shown for such a row (more samples or a stated
tolerance would decide it); 4 the previous card is not comparable (the summary says
why); 9 a card that cannot be trusted (with ``CERTIFY_PUBKEY``: unsigned, tampered or another
key's; nothing is compared); otherwise the failing command's own code (e.g. 2 or 3 when
``certify run`` wrote no card). The tolerance (:data:`certify.tolerance.TOLERANCE_RULE`):
Without --tolerance, the gate's tolerance is the smaller of OLD's and NEW's release_tolerance,
a run whose results state none counting as certify's default of 2, so the release under test
can narrow its gate but never widen it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from certify.errors import (
    CARD_WRITTEN_CODES,
    EXIT_CODES,
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_NOT_COMPARABLE,
    EXIT_OK,
    EXIT_UNTRUSTED,
    EXIT_USAGE,
    CertifyError,
    UsageError,
)
from certify.tolerance import TOLERANCE_RULE

#: Every input, its default and what it is (``action.yml`` maps its inputs onto these).
INPUTS: dict[str, tuple[str, str]] = {
    "CERTIFY_MODEL": ("", "ONNX file or http(s) endpoint spec, as for `certify run`"),
    "CERTIFY_SUITE": ("gtsrb", "packaged suite name or suite YAML path"),
    "CERTIFY_DATA": ("", "evaluation data (folder, CSV or .npz); empty: the suite's data.path"),
    "CERTIFY_PREVIOUS_CARD": ("none", "the previous release's card: path, http(s) URL or none"),
    "CERTIFY_OUT": ("certify-card", "folder for the new card (must not hold another run)"),
    "CERTIFY_TOLERANCE": ("", "compare --tolerance: points for rates, percent for scores "
                          "(empty: " + TOLERANCE_RULE + ")"),
    "CERTIFY_SIGNING_KEY": ("", "PEM private key from `certify keygen` (a secret)"),
    "CERTIFY_KEY_PASSPHRASE": ("", "its passphrase, if it has one (a secret)"),
    "CERTIFY_PUBKEY": ("", "public key: verify both cards before comparing"),
    "CERTIFY_RUN_ARGS": ("", "further `certify run` options, shell-quoted"),
    "CERTIFY_PDF": ("true", "write card.pdf and compare.pdf"),
    "CERTIFY_FAIL_ON": ("regression", "regression: fail on a resolved regression only; "
                                      "verdict: also when the card's verdict is not PASS"),
    "CERTIFY_RELEASE_TAG": ("", "release to attach the cards to"),
    "CERTIFY_DATASET_ID": ("", "export --dataset-id: the Hub dataset the data is, if it is one"),
    "CERTIFY_DATASET_SPLIT": ("", "export --dataset-split"),
}
CARD_FILES = ("card.pdf", "card.html", "results.json", "results.json.sig", "model-index.md",
              "summary.md")
COMPARE_FILES = ("compare.pdf", "compare.html", "compare.json")


@dataclass
class Outcome:
    """What the release check did: the job summary, step outputs and exit code."""

    exit_code: int = EXIT_OK
    summary: list[str] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)

    def say(self, *lines: str) -> None:
        """Add lines to the job summary."""
        self.summary.extend(lines)


def _inputs(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (env.get(k) or default).strip() if k != "CERTIFY_SIGNING_KEY"
            else env.get(k, "") for k, (default, _) in INPUTS.items()}


def _certify(args: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a certify command in this interpreter, echoing its output to the job log."""
    proc = subprocess.run([sys.executable, "-m", "certify.cli", *args], capture_output=True,
                          text=True, env=dict(env))
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc


def _error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    return (errors[0] if errors else lines[-1] if lines else f"exit {proc.returncode}")


def _md(text: str) -> str:
    from certify.report.export import md

    return md(text)


def fetch_previous(spec: str, dest: Path) -> Path | None:
    """The previous card as a local path (downloaded into ``dest`` for a URL); None for none."""
    if spec.lower() in ("", "none"):
        return None
    if spec.startswith(("https://", "http://")):
        from certify.service.bounded import Bounds, bounded_request, session

        name = Path(urlparse(spec).path).name
        if not name.endswith((".pdf", ".html", ".json")):
            raise UsageError(f"previous card URL {spec} does not name a card",
                             hint="link card.pdf, card.html or results.json")

        def refused(message: str, hint: str | None) -> UsageError:
            return UsageError(f"could not download the previous card: {message}",
                              hint=hint or "check previous-card, or pass none for a first "
                                           "release")

        dest.mkdir(parents=True, exist_ok=True)
        path = dest / name
        # within a deadline and a byte cap, streamed to the file (as the service's client)
        answer = bounded_request(session(), "GET", spec, Bounds(), refused,
                                 what=f"GET {spec}", dest=path, redirects=5,
                                 where=f"the previous card's server ({spec})")
        if answer.status != 200:
            path.unlink(missing_ok=True)
            raise UsageError(f"could not download the previous card {spec}: HTTP "
                             f"{answer.status}", hint="check previous-card, or pass none for "
                                                      "a first release")
        return path
    path = Path(spec)
    if not path.exists():
        raise UsageError(f"previous card {spec} not found",
                         hint="a run folder, card.pdf, card.html or results.json; or none")
    return path


def _value(v: Any, interval: Any = None) -> str:
    if v is None:
        return "–"
    text = f"{v:.3f}"
    if interval and all(x is not None for x in interval):
        text += f" [{interval[0]:.3f}, {interval[1]:.3f}]"
    return text


def comparison_lines(doc: dict[str, Any]) -> list[str]:
    """A Markdown table of ``certify compare --json``'s rows: the threat models' first (with
    the checks that are not attack rows, they decide), then the checks', attack rows marked as
    evidence for their threat model's row."""
    lines = ["| check | compared | OLD | NEW | change [corrected] | result |",
             "|---|---|---|---|---|---|"]
    for r in [*doc.get("threat_models", []), *doc["checks"]]:
        # one quantity per row: the one the change is on (OLD and NEW of it)
        old = r["old_value"] if r.get("old_value") is not None else r["old"]
        new = r["new_value"] if r.get("new_value") is not None else r["new"]
        result = r["outcome"] + (f" ({r['reason']})" if r.get("reason") else "")
        if r.get("evidence_for"):
            result += f"; evidence for {r['evidence_for']}, not gating"
        lines.append(f"| {_md(r['id'])} | {_md(r.get('compared') or r.get('metric') or '–')} "
                     f"| {_md(_value(old))} | {_md(_value(new))} | "
                     f"{_md(_value(r['change'], r['change_interval']))} | {_md(result)} |")
    return lines


def release_asset_url(env: Mapping[str, str], tag: str, name: str) -> str | None:
    """Where ``name`` will be downloadable once attached to release ``tag`` (None when the
    cards will not be attached: no tag, token or repository)."""
    repo = env.get("GITHUB_REPOSITORY")
    if not (tag and repo and env.get("GH_TOKEN")):
        return None
    server = env.get("GITHUB_SERVER_URL") or "https://github.com"
    return f"{server}/{repo}/releases/download/{tag}/{name}"


def upload(tag: str, files: list[Path], env: Mapping[str, str]) -> str:
    """``gh release upload`` the files; returns the summary's sentence (never raises)."""
    if not tag:
        return ("Not attached to a release: no release tag (run on a `release` event, or set "
                "the `release-tag` input).")
    if not env.get("GH_TOKEN"):
        return (f"Not attached to release {_md(tag)}: no token (set the `github-token` input; "
                "the job needs `permissions: contents: write`).")
    cmd = ["gh", "release", "upload", tag, *map(str, files), "--clobber"]
    if env.get("GITHUB_REPOSITORY"):
        cmd += ["--repo", env["GITHUB_REPOSITORY"]]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(env))
    except FileNotFoundError:
        return f"Not attached to release {_md(tag)}: the `gh` command is not installed."
    if proc.returncode != 0:
        return (f"Not attached to release {_md(tag)}: `gh release upload` failed: "
                f"{_md(_error_line(proc))}")
    return f"Attached to release {_md(tag)}: " + ", ".join(f"`{f.name}`" for f in files) + "."


def release_check(env: Mapping[str, str]) -> Outcome:
    """Run, export, compare and attach, as the action does; never raises a CertifyError."""
    o = Outcome()
    inp = _inputs(env)
    child = {k: v for k, v in env.items() if k != "CERTIFY_SIGNING_KEY"}
    out = Path(inp["CERTIFY_OUT"])
    o.outputs["card-dir"] = str(out)
    try:
        if not inp["CERTIFY_MODEL"]:
            raise UsageError("no model given", hint="set the action's `model` input")
        try:
            tolerance = (float(inp["CERTIFY_TOLERANCE"]) if inp["CERTIFY_TOLERANCE"].strip()
                         else None)
        except ValueError:
            raise UsageError(f"tolerance {inp['CERTIFY_TOLERANCE']!r} is not a number",
                             hint="e.g. 1 (points for rates, percent for scores)") from None
        if inp["CERTIFY_FAIL_ON"] not in ("regression", "verdict"):
            raise UsageError(f"fail-on {inp['CERTIFY_FAIL_ON']!r} is not regression or verdict",
                             hint="regression (default) or verdict")
        pdf = inp["CERTIFY_PDF"].lower() not in ("false", "0", "no")
        run_rc = _run(inp, child, out, pdf, o)
        if run_rc not in CARD_WRITTEN_CODES:
            o.exit_code = run_rc
            return o
        _compare(inp, child, out, pdf, tolerance, o)
        if inp["CERTIFY_FAIL_ON"] == "verdict" and o.exit_code == EXIT_OK and run_rc != 0:
            o.exit_code = run_rc
            o.say("", f"The job fails on the card's verdict (`fail-on: verdict`): exit {run_rc}.")
        files = [out / f for f in (*CARD_FILES, *COMPARE_FILES) if (out / f).is_file()]
        o.say("", "### Release assets", "", upload(inp["CERTIFY_RELEASE_TAG"], files, env))
    except CertifyError as exc:
        o.exit_code = exc.exit_code
        o.say("", f"**certify release check stopped:** {_md(exc.message)}"
              + (f" ({_md(exc.hint)})" if exc.hint else ""))
    o.outputs["exit-code"] = str(o.exit_code)
    return o


def _run(inp: dict[str, str], env: dict[str, str], out: Path, pdf: bool, o: Outcome) -> int:
    args = ["run", inp["CERTIFY_MODEL"], "--suite", inp["CERTIFY_SUITE"], "--out", str(out)]
    if inp["CERTIFY_DATA"]:
        args += ["--data", inp["CERTIFY_DATA"]]
    if not pdf:
        args.append("--no-pdf")
    args += shlex.split(inp["CERTIFY_RUN_ARGS"])
    with tempfile.TemporaryDirectory() as tmp:
        if inp["CERTIFY_SIGNING_KEY"].strip():
            key = Path(tmp) / "signing.key"
            key.touch(mode=0o600)
            key.write_text(inp["CERTIFY_SIGNING_KEY"].strip() + "\n", encoding="utf-8")
            args += ["--sign-key", str(key)]
            if inp["CERTIFY_KEY_PASSPHRASE"]:
                env = {**env, "CERTIFY_KEY_PASSPHRASE": inp["CERTIFY_KEY_PASSPHRASE"]}
                args += ["--passphrase-env", "CERTIFY_KEY_PASSPHRASE"]
        proc = _certify(args, env)
    o.outputs["run-exit-code"] = str(proc.returncode)
    if proc.returncode not in CARD_WRITTEN_CODES:
        o.say("## certify: no card", "",
              f"`certify run` exited {proc.returncode} "
              f"({_md(EXIT_CODES.get(proc.returncode, 'unknown'))}) and wrote no card: "
              f"{_md(_error_line(proc))}")
        return proc.returncode
    res = json.loads((out / "results.json").read_text(encoding="utf-8"))
    m = res["measurement"]
    o.outputs["verdict"] = m["verdict"]
    signed = (out / "results.json.sig").is_file()
    o.say(f"## certify: {_md(m['model']['name'])}: {_md(m['verdict'])}", "",
          f"`certify run` exited {proc.returncode}; the card is "
          + ("signed" if signed else "**not signed** (no `signing-key` given)") + ".")
    export = ["export", str(out)]
    if inp["CERTIFY_DATASET_ID"]:
        export += ["--dataset-id", inp["CERTIFY_DATASET_ID"]]
        if inp["CERTIFY_DATASET_SPLIT"]:
            export += ["--dataset-split", inp["CERTIFY_DATASET_SPLIT"]]
    url = release_asset_url(env, inp["CERTIFY_RELEASE_TAG"], "card.pdf")
    if url and pdf:
        export += ["--source-url", url]
    exp = _certify(export, env)
    if exp.returncode != 0:
        raise CertifyError(f"certify export failed: {_error_line(exp)}")
    o.say("", (out / "summary.md").read_text(encoding="utf-8").replace(
        "## Robustness card", "### Robustness card", 1))
    return proc.returncode


def _compare(inp: dict[str, str], env: dict[str, str], out: Path, pdf: bool,
             tolerance: float | None, o: Outcome) -> None:
    o.say("### Comparison with the previous release", "")
    previous = fetch_previous(inp["CERTIFY_PREVIOUS_CARD"],
                              out.parent / f"{out.name}-previous")
    if previous is None:
        o.outputs["comparison"] = "none"
        o.say("No previous card (`previous-card: none`): nothing to compare. This is the "
              "first card of this model; the next release is compared with it.")
        return
    args = ["compare", str(previous), str(out),
            *(["--tolerance", str(tolerance)] if tolerance is not None else []),
            "--json", str(out / "compare.json"), "--html", str(out / "compare.html")]
    if pdf:
        args += ["--pdf", str(out / "compare.pdf")]
    if inp["CERTIFY_PUBKEY"]:
        args += ["--pubkey", inp["CERTIFY_PUBKEY"]]
    for stale in COMPARE_FILES:  # never report an earlier comparison as this one
        (out / stale).unlink(missing_ok=True)
    proc = _certify(args, env)
    o.outputs["compare-exit-code"] = str(proc.returncode)
    where = _md(inp["CERTIFY_PREVIOUS_CARD"])
    js = out / "compare.json"
    if proc.returncode == EXIT_NOT_COMPARABLE:
        o.outputs["comparison"] = "not comparable"
        o.exit_code = EXIT_NOT_COMPARABLE
        o.say(f"**Not comparable** with the previous card ({where}): "
              f"{_md(_error_line(proc))}. The job fails: a release must be compared on the "
              "same suite, data and threat model (or start a new baseline with "
              "`previous-card: none`).")
        return
    if proc.returncode == EXIT_UNTRUSTED:
        o.outputs["comparison"] = "untrusted"
        o.exit_code = EXIT_UNTRUSTED
        o.say(f"**Untrusted card**, not compared ({where}): {_md(_error_line(proc))}. The job "
              "fails (exit 9): a card that does not verify with the given public key is not "
              "evidence of anything, better or worse.")
        return
    if proc.returncode not in (EXIT_OK, EXIT_FAIL, EXIT_INCONCLUSIVE) or not js.is_file():
        # a refusal before any comparison (e.g. a signature that does not verify)
        o.outputs["comparison"] = "error"
        o.exit_code = proc.returncode or EXIT_USAGE
        o.say(f"**Not compared** with the previous card ({where}): {_md(_error_line(proc))}.")
        return
    doc = json.loads(js.read_text(encoding="utf-8"))
    tolerance = float(doc["tolerance"]["rates_pp"])  # as the comparison used it
    regs = list(doc["regressions"])
    o.outputs["regressions"] = ",".join(regs)
    if proc.returncode == EXIT_FAIL:
        gated = [r["id"] for r in [*doc.get("threat_models", []), *doc["checks"]]
                 if r["id"] in regs and r["has_threshold"]]
        o.outputs["comparison"] = "regression"
        o.exit_code = EXIT_FAIL
        o.say(f"**Resolved regression** against the previous card ({where}) on: "
              + ", ".join(f"**{_md(r)}**" for r in gated)
              + f" (tolerance {tolerance:g}). The job fails.")
    elif proc.returncode == EXIT_INCONCLUSIVE:
        o.outputs["comparison"] = "inconclusive"
        o.exit_code = EXIT_INCONCLUSIVE
        o.say(f"**Inconclusive** against the previous card ({where}, tolerance "
              f"{tolerance:g}): neither a regression nor non-inferiority is shown on "
              + ", ".join(f"**{_md(r)}**" for r in doc.get("inconclusive", []))
              + ". More samples, or a stated `tolerance`, decide it. The job fails (exit 6).")
    else:
        o.outputs["comparison"] = "ok"
        extra = (f" (resolved regression only on checks without a threshold: "
                 f"{_md(', '.join(regs))})" if regs else "")
        decided = f"**{_md(str(doc['decision']))}**: " if doc.get("decision") else ""
        o.say(f"{decided}No resolved regression against the previous card ({where}, "
              f"tolerance {tolerance:g}): every threat model and check with a threshold is "
              f"unchanged or non-inferior{extra}.")
    o.say("", *comparison_lines(doc))


def write_github_files(o: Outcome, env: Mapping[str, str], out: Path) -> None:
    """The summary to ``<out>/job-summary.md`` (and GITHUB_STEP_SUMMARY), outputs to
    GITHUB_OUTPUT when set."""
    text = "\n".join(o.summary) + "\n"
    if out.is_dir():
        (out / "job-summary.md").write_text(text, encoding="utf-8")
        o.outputs["summary"] = str(out / "job-summary.md")
    if env.get("GITHUB_STEP_SUMMARY"):
        with open(env["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as f:
            f.write(text)
    if env.get("GITHUB_OUTPUT"):
        with open(env["GITHUB_OUTPUT"], "a", encoding="utf-8") as f:
            for k, v in o.outputs.items():
                f.write(f"{k}={v.replace(chr(10), ' ')}\n")


def main(env: Mapping[str, str] | None = None) -> int:
    """Entry point: ``python -m certify.ci_action`` (inputs from the environment)."""
    env = dict(os.environ if env is None else env)
    o = release_check(env)
    write_github_files(o, env, Path(_inputs(env)["CERTIFY_OUT"]))
    sys.stdout.write("\n".join(o.summary) + "\n")
    return o.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
