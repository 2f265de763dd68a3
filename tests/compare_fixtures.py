"""Stored outputs of ``certify compare`` on the test suite's pairs of runs, and their inputs.

``tests/test_compare_fixtures.py`` reruns every case (:data:`CASES`) on the stored inputs and
asserts the outputs equal the stored ones. Write them from the repository root (a minute or
two: the real runs below)::

    python tests/compare_fixtures.py            # inputs and expected outputs
    python tests/compare_fixtures.py --outputs  # expected outputs only, from the stored inputs
    python tests/compare_fixtures.py --synthetic  # the synthetic inputs and the outputs

Under ``tests/data/compare``:

- ``inputs/``: the results documents compared, each gzipped (``zcat`` reads them; unpacked by
  :func:`unpack`). The synthetic ones are the pairs the unit tests of ``tests/test_compare.py``
  build with its helpers (identical runs, regressions, improvements, unpaired samples, not
  comparable, threat-model rows, continuous scores, SKIPPED and ERROR rows, the default
  tolerance...). The real ones are runs of certify on the test suite's tiny model (``tiny-*``:
  the ``runs`` fixture of ``tests/test_compare.py``; ``tiny-signed`` is ``tiny-base`` signed
  with ``keys/certify.pub``'s key, and ``tiny-base.card.html`` its card reduced to the embedded
  results) and on the demo models with the small demo suite (``demo-*``: every check kind),
  and a run of ``tests/data/previous_release/suite.yaml`` (``previous-rerun``), compared with
  the previous release's stored results (``certify.results/2``, unpacked from that folder).
- ``expected/<case>.json``: the command's arguments and, for ``certify compare OLD NEW [ARGS]``
  at 200 columns (a table), at 80 columns (one block per row) and with ``--json -``: the exit
  code, stdout and stderr (the JSON output parsed).

The command runs in the unpacked folder with OLD and NEW relative to it, so no output holds a
path or anything else that varies between machines or runs: outputs are compared as they are,
nothing normalised. Regenerate the expected outputs only for a deliberate change of compare's
output, and say why in the commit.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

TESTS = Path(__file__).resolve().parent
HERE = TESTS / "data" / "compare"
sys.path.insert(0, str(TESTS))

#: Each case: (name, OLD, NEW, further arguments), OLD and NEW relative to this folder.
CASES: list[tuple[str, str, str, list[str]]] = []


def _case(name: str, old: str, new: str, *args: str) -> None:
    CASES.append((name, old, new, list(args)))


def _in(name: str) -> str:
    return f"inputs/{name}.json"


# --- synthetic pairs (tests/test_compare.py's builders) ----------------------------------------

def synthetic_inputs() -> dict[str, dict[str, Any]]:
    """The synthetic results documents, by name."""
    import test_compare as t

    docs: dict[str, dict[str, Any]] = {}
    # same samples, a small discordance (6 worse, 2 better of 400)
    n = 400
    rng = np.random.default_rng(0)
    old = rng.random(n) < 0.9
    new = old.copy()
    new[np.flatnonzero(old)[:6]] = False
    new[np.flatnonzero(~old)[:2]] = True
    sel = np.ones(n, dtype=bool)
    docs["clean400-old"], docs["clean400-new"] = t._result(old, sel), t._result(new, sel)
    # 20 of 1000 broke, none fixed; the same with another seed; 2 broke
    n = 1000
    old = np.zeros(n, dtype=bool)
    old[:900] = True
    sel = np.ones(n, dtype=bool)
    docs["clean1000-old"] = t._result(old, sel)
    for k in (20, 2):
        new = old.copy()
        new[:k] = False
        docs[f"clean1000-drop{k}"] = t._result(new, sel)
    new = old.copy()
    new[:20] = False
    docs["clean1000-drop20-seed1"] = t._result(new, sel, seed=1)
    # other selected samples
    n = 200
    correct = np.ones(n, dtype=bool)
    a = np.zeros(n, dtype=bool)
    a[:100] = True
    docs["select-a"], docs["select-b"] = t._result(correct, a), t._result(correct, ~a)
    # not comparable
    sel = np.ones(50, dtype=bool)
    docs["clean50"] = t._result(sel, sel)
    docs["clean50-data2"] = t._result(sel, sel, data="d2")
    docs["clean50-params"] = t._result(sel, sel, params={"top_confusions": 3})
    docs["clean50-reference"] = t._result(sel, sel, reference="sha256:r")
    docs["clean50-schema1"] = {**t._result(sel, sel), "schema": "certify.results/1"}
    err = t._result(sel, sel)
    err["measurement"]["checks"][0].update(status="ERROR", metrics=None, intervals={},
                                           outcomes=None, error="boom")
    docs["clean50-error"] = err
    # thirty rows, one dropped 10 samples of 40
    sel = np.ones(40, dtype=bool)
    old = np.zeros(40, dtype=bool)
    old[:32] = True
    new = old.copy()
    new[:10] = False
    docs["many-old"] = t._many(30, (old, new), old, sel, 0)
    docs["many-new"] = t._many(30, (old, new), old, sel, 1)
    docs["many-same"] = t._many(30, None, old, sel, 0)
    # another suite version
    sel = np.ones(50, dtype=bool)
    docs["version-old"] = t._many(3, None, sel, sel, 0)
    newer = t._many(3, None, sel, sel, 0)
    newer["measurement"]["suite"]["digest"] = "s-newer"
    del newer["measurement"]["checks"][2]
    newer["measurement"]["checks"][1]["params"] = {"top_confusions": 3}
    docs["version-new"] = newer
    # convergence of a check's attack
    sel = np.ones(400, dtype=bool)
    old = np.zeros(400, dtype=bool)
    old[:200] = True
    new = old.copy()
    new[200:300] = True
    a, b = t._result(old, sel), t._result(new, sel)
    a["measurement"]["checks"][0]["settled"] = {"attack_converged": False}
    docs["unconverged-a"], docs["unconverged-b"] = a, b
    docs["unconverged-base"] = t._result(old, sel)
    worse = old.copy()
    worse[:2] = False
    c = t._result(worse, sel)
    c["measurement"]["checks"][0]["settled"] = {"attack_converged": False}
    docs["unconverged-c"] = c
    # continuous scores: paired and unpaired bootstrap, and the normal approximation
    n = 60
    rng = np.random.default_rng(1)
    sel = np.ones(n, dtype=bool)
    old_v = rng.lognormal(0.0, 1.0, n)
    docs["brittle-old"] = t._doc([t._brittle(old_v, sel)], n)
    docs["brittle-new"] = t._doc([t._brittle(old_v * 1.2, sel)], n)
    docs["brittle-new-seed1"] = t._doc([t._brittle(old_v * 1.2, sel)], n, seed=1)
    checks = [t._brittle(np.full(n, 1.0), sel, 0.1), t._brittle(np.full(n, 1.5), sel, 0.1)]
    for ch in checks:
        ch["outcomes"]["values"] = {}
    docs["score-intervals-old"] = t._doc([checks[0]], n)
    docs["score-intervals-new"] = t._doc([checks[1]], n)
    docs.update(_interval_family(t))
    docs.update(_threat_inputs(t))
    return docs


def _interval_family(t: Any) -> dict[str, dict[str, Any]]:
    """Rows compared by the normal approximation in a Holm family of four (so at levels other
    than 95%): three scores without per-sample values (a resolved regression, a small change
    that leaves the row undecided, no change) and a rate whose runs kept no per-sample
    outcomes."""
    from certify.stats import wilson_interval

    n = 60
    sel = np.ones(n, dtype=bool)
    docs: dict[str, dict[str, Any]] = {}
    for side, values in (("old", (1.0, 1.0, 1.2)), ("new", (1.6, 1.04, 1.2))):
        checks = []
        for k, v in enumerate(values):
            c = t._brittle(np.full(n, v), sel, 0.1 + 0.02 * k)
            c["id"], c["outcomes"]["values"] = f"score{k}", {}
            checks.append(c)
        correct = np.zeros(n, dtype=bool)
        correct[: 45 if side == "old" else 41] = True
        rate = t._result(correct, sel)["measurement"]["checks"][0]
        rate["outcomes"] = None
        rate["intervals"] = {"accuracy": list(wilson_interval(int(correct.sum()), n))}
        checks.append(rate)
        docs[f"interval-family-{side}"] = t._doc(checks, n)
    return docs


def _threat_inputs(t: Any) -> dict[str, dict[str, Any]]:
    """Threat-model rows: evidence, convergence, SKIPPED and ERROR attacks, the tolerance."""
    docs: dict[str, dict[str, Any]] = {}
    n = 400
    a = np.zeros(n, dtype=bool)
    a[:300] = True
    b_new = np.zeros(n, dtype=bool)
    b_new[100:] = True
    docs["tm-old"], docs["tm-new"] = t._threat_doc(a, a), t._threat_doc(a, b_new)
    for name in ("tm-old", "tm-new"):
        alone = copy.deepcopy(docs[name])
        alone["measurement"]["attack_worst_case"] = []
        docs[f"{name}-no-summary"] = alone
    worse = a.copy()
    worse[:3] = False
    unconv = t._threat_doc(a, worse, settled_b={"attack_converged": False})
    unconv["measurement"]["checks"][1]["details"] = {"convergence": {"converged": True}}
    docs["tm-worse3-unconverged"] = unconv
    docs["tm-worse3"] = t._threat_doc(a, worse)
    docs["tm-skip-b"] = t._skipped(t._threat_doc(a, a), "b")
    worse100 = a.copy()
    worse100[:100] = False
    docs["tm-worse100-skip-b"] = t._skipped(t._threat_doc(worse100, a), "b")
    errored = t._skipped(t._threat_doc(a, a), "b")
    errored["measurement"]["checks"][1]["status"] = "ERROR"
    docs["tm-skip-b-error"] = errored
    inh = t._threat_doc(a, a)
    inh["measurement"]["checks"][1]["details"] = {"inherited": {"samples": 100,
                                                                "by": {"a": 100}}}
    docs["tm-inherited-old"] = inh
    alone = np.ones(n, dtype=bool)
    alone[:20] = False
    docs["tm-inherited-new"] = t._skipped(t._threat_doc(a, alone), "a")
    n = 300
    a300 = np.zeros(n, dtype=bool)
    a300[:200] = True
    docs["tm300-skip-b"] = t._skipped(t._threat_doc(a300, a300), "b")
    both = t._skipped(t._skipped(t._threat_doc(a300, a300), "a"), "b")
    both["measurement"]["attack_worst_case"] = []
    docs["tm300-all-skipped"] = both
    both_err = t._skipped(t._threat_doc(a300, a300), "b")
    both_err["measurement"]["checks"][1]["status"] = "ERROR"
    docs["tm300-b-error"] = both_err
    # a check OLD evaluated and NEW SKIPPED (or ERROR)
    sel = np.ones(100, dtype=bool)
    docs["clean100"] = t._result(sel, sel)
    for status in ("SKIPPED", "ERROR"):
        d = t._result(sel, sel)
        d["measurement"]["checks"][0].update(status=status, metrics=None, intervals={},
                                             outcomes=None, decision="not run here")
        docs[f"clean100-{status.lower()}"] = d
    docs.update(_tolerance_inputs(t))
    # one denominator: attack rows gated on their success rate
    for name in ("rate-old", "rate-new"):
        d = t._threat_doc(a, a)
        for ch in d["measurement"]["checks"]:
            ch["metrics"]["attack_success_rate"] = 0.4
            ch["threshold"] = {"metric": "attack_success_rate", "min": None, "max": 0.5,
                               "text": "≤ 0.5", "rule": "interval"}
        docs[name] = d
    docs.update(_crowded(t, a, worse))
    wide_old, wide_new = t._wide_new_pair()
    docs["wide-old"], docs["wide-new"] = wide_old, wide_new
    return docs


def _tolerance_inputs(t: Any) -> dict[str, dict[str, Any]]:
    """The default tolerance (release_tolerance) and a planted change at n = 600."""
    docs: dict[str, dict[str, Any]] = {}
    n = 600
    base = np.zeros(n, dtype=bool)
    base[:420] = True

    def run(robust: np.ndarray, tolerance: float | None = None) -> dict[str, Any]:
        d = t._threat_doc(robust, robust)
        d["measurement"]["suite"]["release_tolerance"] = tolerance
        return d

    docs["tol-base"] = run(base)
    for tol in (5.0, 3.0):
        docs[f"tol-base-{tol:g}"] = run(base, tol)
    drop = base.copy()
    drop[:60] = False
    docs["tol-drop"] = run(drop)
    gain = base.copy()
    gain[420:480] = True
    docs["tol-gain"] = run(gain)
    noisy = base.copy()
    noisy[:12] = False
    noisy[420:426] = True
    docs["tol-noisy"] = run(noisy)
    # as many pairs, at the same discordant rates, as the unit test finds decide it
    k = 4
    docs["tol-base-x4"], docs["tol-noisy-x4"] = run(np.tile(base, k)), run(np.tile(noisy, k))
    return docs


def _crowded(t: Any, a: np.ndarray, worse: np.ndarray) -> dict[str, dict[str, Any]]:
    """tests/test_compare.py's crowded comparison: long ids, long reasons, an extra check."""
    old, new = t.crowded_docs(a, worse)
    return {"crowded-old": old, "crowded-new": new}


def synthetic_cases() -> None:
    _case("paired-small-discordance", _in("clean400-old"), _in("clean400-new"))
    _case("paired-small-discordance-tol5", _in("clean400-old"), _in("clean400-new"),
          "--tolerance", "5")
    _case("paired-regression", _in("clean1000-old"), _in("clean1000-drop20"))
    _case("paired-regression-reversed", _in("clean1000-drop20"), _in("clean1000-old"))
    _case("unpaired-other-seed", _in("clean1000-old"), _in("clean1000-drop20-seed1"))
    _case("paired-drop-within-tol5", _in("clean1000-old"), _in("clean1000-drop20"),
          "--tolerance", "5")
    _case("identical", _in("clean1000-old"), _in("clean1000-old"))
    _case("paired-small-drop", _in("clean1000-old"), _in("clean1000-drop2"))
    _case("unpaired-other-samples", _in("select-a"), _in("select-b"))
    _case("not-comparable-data", _in("clean50"), _in("clean50-data2"))
    _case("not-comparable-params", _in("clean50"), _in("clean50-params"))
    _case("not-comparable-reference", _in("clean50"), _in("clean50-reference"))
    _case("not-comparable-schema", _in("clean50-schema1"), _in("clean50"))
    _case("check-errored", _in("clean50"), _in("clean50-error"))
    _case("thirty-rows-one-drop", _in("many-old"), _in("many-new"))
    _case("thirty-rows-identical", _in("many-same"), _in("many-same"))
    _case("another-suite-version", _in("version-old"), _in("version-new"))
    _case("unconverged-old-gain", _in("unconverged-a"), _in("unconverged-b"))
    _case("unconverged-new-drop", _in("unconverged-b"), _in("unconverged-a"))
    _case("unconverged-new-small-drop", _in("unconverged-base"), _in("unconverged-c"),
          "--tolerance", "50")
    _case("bootstrap-paired", _in("brittle-old"), _in("brittle-new"))
    _case("bootstrap-paired-tol30", _in("brittle-old"), _in("brittle-new"), "--tolerance", "30")
    _case("bootstrap-unpaired", _in("brittle-old"), _in("brittle-new-seed1"))
    _case("normal-approximation", _in("score-intervals-old"), _in("score-intervals-new"))
    _case("normal-approximation-family", _in("interval-family-old"),
          _in("interval-family-new"))
    _case("normal-approximation-family-tol5", _in("interval-family-old"),
          _in("interval-family-new"), "--tolerance", "5")
    _case("threat-model-regression", _in("tm-old"), _in("tm-new"), "--tolerance", "10")
    _case("attack-rows-alone", _in("tm-old-no-summary"), _in("tm-new-no-summary"),
          "--tolerance", "10")
    _case("threat-model-unconverged", _in("tm-old"), _in("tm-worse3-unconverged"),
          "--tolerance", "20")
    _case("threat-model-non-inferior", _in("tm-old"), _in("tm-worse3"), "--tolerance", "20")
    _case("skipped-in-both", _in("tm300-skip-b"), _in("tm300-skip-b"))
    _case("all-attacks-skipped", _in("tm300-all-skipped"), _in("tm300-all-skipped"))
    _case("attack-skipped-in-new", _in("tm-old"), _in("tm-skip-b"))
    _case("attack-skipped-regression", _in("tm-old"), _in("tm-worse100-skip-b"))
    _case("attack-skipped-errored", _in("tm-old"), _in("tm-skip-b-error"))
    _case("inherited-breaks", _in("tm-inherited-old"), _in("tm-inherited-new"))
    _case("new-skipped", _in("clean100"), _in("clean100-skipped"))
    _case("old-skipped", _in("clean100-skipped"), _in("clean100"))
    _case("old-skipped-new-error", _in("clean100-skipped"), _in("clean100-error"))
    _case("attack-errored-in-both", _in("tm300-b-error"), _in("tm300-b-error"))
    _case("default-tolerance", _in("tol-base"), _in("tol-base"))
    _case("smaller-stated-tolerance", _in("tol-base-5"), _in("tol-base-3"))
    _case("planted-regression", _in("tol-base"), _in("tol-drop"))
    _case("planted-improvement", _in("tol-base"), _in("tol-gain"))
    _case("planted-noise-samples-needed", _in("tol-base"), _in("tol-noisy"))
    _case("planted-noise-more-samples", _in("tol-base-x4"), _in("tol-noisy-x4"))
    _case("one-denominator", _in("rate-old"), _in("rate-new"))
    _case("crowded", _in("crowded-old"), _in("crowded-new"))
    _case("wide-new-tolerance", _in("wide-old"), _in("wide-new"))


# --- real runs ---------------------------------------------------------------------------------

def _run(*args: Any) -> None:
    import builders

    proc = builders.run_cli(*args)
    assert proc.returncode in (0, 1, 6, 7), proc.stdout + proc.stderr


def real_inputs(tmp: Path, dest: Path) -> None:
    """Runs of certify on the tiny model and the demo models, written under ``dest``: their
    results.json as ``<name>.json``, and the signed run as a folder."""
    import test_compare as t

    from certify.api import DEMO_PER_CLASS, DEMO_SEED, demo_model_path
    from certify.demo.synthetic import generate
    from certify.report.sign import embedded_parts

    import builders

    net = builders.make_net(seed=0)
    model = builders.export(net, tmp / "tiny.onnx")
    suite = t._suite(tmp / "s.yaml")
    data = builders.write_labelled_npz(net, tmp / "d.npz", 120, seed=11)
    other = builders.write_labelled_npz(net, tmp / "other.npz", 120, seed=12)
    weak = builders.export(builders.make_net(seed=1), tmp / "weak.onnx")
    runs = {"tiny-base": (model, data, "0"), "tiny-other-data": (model, other, "0"),
            "tiny-weak": (weak, data, "0"), "tiny-seed1": (model, data, "1")}
    for name, (m, d, seed) in runs.items():
        _run("run", m, "--suite", suite, "--data", d, "--out", tmp / name, "--no-pdf",
             "--quiet", "--seed", seed)
        shutil.copy(tmp / name / "results.json", dest / f"{name}.json")
    # the card, reduced to what compare reads of it: its embedded results
    card = (tmp / "tiny-base" / "card.html").read_text(encoding="utf-8")
    (dest / "tiny-base.card.html").write_text(
        '<!doctype html>\n<html><body>\n<script type="application/json" id="certify-results">'
        + embedded_parts(card)["results"] + "</script>\n</body></html>\n", encoding="utf-8")
    keys = tmp / "keys"
    _run("keygen", "--out", keys)
    signed = tmp / "tiny-signed"
    shutil.copytree(tmp / "tiny-base", signed)
    _run("sign", signed, "--key", keys / "certify.key", "--no-pdf")
    (dest / "tiny-signed").mkdir()
    for name in ("results.json", "results.json.sig"):
        shutil.copy(signed / name, dest / "tiny-signed" / name)
    (HERE / "keys").mkdir(parents=True, exist_ok=True)
    shutil.copy(keys / "certify.pub", HERE / "keys" / "certify.pub")

    x, y = generate(DEMO_PER_CLASS, seed=DEMO_SEED)
    np.savez(tmp / "demo.npz", x=x, y=y)
    small = builders.write_demo_small_suite(tmp / "small.yaml")
    for name, m, seed in (("demo-standard", "standard", "0"), ("demo-robust", "robust", "0"),
                          ("demo-robust-seed1", "robust", "1")):
        _run("run", demo_model_path(m), "--suite", small, "--data", tmp / "demo.npz", "--out",
             tmp / name, "--no-pdf", "--quiet", "--seed", seed)
        shutil.copy(tmp / name / "results.json", dest / f"{name}.json")
    x, y = generate(1, seed=29)
    np.savez(tmp / "prev-data.npz", x=x, y=y)  # the name is part of the digest
    _run("run", demo_model_path("standard"), "--suite", PREVIOUS / "suite.yaml", "--data",
         tmp / "prev-data.npz", "--out", tmp / "previous-rerun", "--no-pdf", "--quiet")
    shutil.copy(tmp / "previous-rerun" / "results.json", dest / "previous-rerun.json")


def real_cases() -> None:
    _case("tiny-card-html", _in("tiny-base"), "inputs/tiny-base.card.html")
    _case("tiny-run-folder", "inputs/tiny-signed", _in("tiny-base"))
    _case("tiny-other-seed", _in("tiny-base"), _in("tiny-seed1"))
    _case("tiny-other-seed-tol60", _in("tiny-base"), _in("tiny-seed1"), "--tolerance", "60")
    _case("tiny-other-data", _in("tiny-base"), _in("tiny-other-data"))
    _case("tiny-weaker", _in("tiny-base"), _in("tiny-weak"))
    _case("tiny-stronger", _in("tiny-weak"), _in("tiny-base"))
    _case("tiny-signed", "inputs/tiny-signed", "inputs/tiny-signed", "--pubkey",
          "keys/certify.pub")
    _case("tiny-unsigned-untrusted", "inputs/tiny-signed", _in("tiny-weak"), "--pubkey",
          "keys/certify.pub")
    _case("demo-identical", _in("demo-standard"), _in("demo-standard"))
    _case("demo-standard-after-robust", _in("demo-robust"), _in("demo-standard"))
    _case("demo-robust-after-standard", _in("demo-standard"), _in("demo-robust"))
    _case("demo-other-seed", _in("demo-robust"), _in("demo-robust-seed1"))
    _case("demo-other-seed-tol25", _in("demo-robust"), _in("demo-robust-seed1"),
          "--tolerance", "25")
    _case("previous-release", _in("previous-release"), _in("previous-rerun"))


synthetic_cases()
real_cases()


# --- storing and unpacking ----------------------------------------------------------------------

#: The previous release's results and suite (``tests/test_previous_release.py``).
PREVIOUS = TESTS / "data" / "previous_release"


def store_inputs(plain: Path) -> None:
    """Every file under ``plain`` gzipped into ``inputs/`` (reproducibly: no name, no time)."""
    inputs = HERE / "inputs"
    for path in sorted(p for p in plain.rglob("*") if p.is_file()):
        target = inputs / path.relative_to(plain).with_name(path.name + ".gz")
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                     filename="") as gz:
            gz.write(path.read_bytes())


def unpack(dest: Path) -> Path:
    """The stored inputs unpacked under ``dest`` as the cases name them (``inputs/``, ``keys/``,
    the previous release's results as ``inputs/previous-release.json``); returns ``dest``."""
    for path in sorted((HERE / "inputs").rglob("*.gz")):
        target = dest / "inputs" / path.relative_to(HERE / "inputs").with_suffix("")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(gzip.decompress(path.read_bytes()))
    shutil.copy(PREVIOUS / "results.json", dest / "inputs" / "previous-release.json")
    shutil.copytree(HERE / "keys", dest / "keys")
    return dest


#: How each case is run: the terminal's width, and whether ``--json -`` is added.
MODES = {"table": ("200", False), "blocks": ("80", False), "json": ("200", True)}


def run_case(old: str, new: str, args: list[str],
             invoke: Callable[..., Any]) -> dict[str, Any]:
    """The outputs of one case in each of :data:`MODES` (``invoke(*argv, env=...)``, run in the
    unpacked folder, returns an object with ``returncode``, ``stdout`` and ``stderr``)."""
    out: dict[str, Any] = {"old": old, "new": new, "args": args}
    for mode, (columns, as_json) in MODES.items():
        argv = ["compare", old, new, *args, *(["--json", "-"] if as_json else [])]
        proc = invoke(*argv, env={"COLUMNS": columns})
        stdout: Any = proc.stdout
        if as_json and proc.stdout:
            stdout = json.loads(proc.stdout)
        out[mode] = {"exit_code": proc.returncode, "stdout": stdout, "stderr": proc.stderr}
    return out


def expected_text(doc: dict[str, Any]) -> str:
    """How an expected output is stored (the same text for the same outputs)."""
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def write_outputs() -> None:
    import builders

    expected = HERE / "expected"
    if expected.exists():
        shutil.rmtree(expected)
    expected.mkdir()
    cwd = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(unpack(Path(tmp)))
        try:
            for name, old, new, args in CASES:
                doc = run_case(old, new, args, builders.run_cli)
                (expected / f"{name}.json").write_text(expected_text(doc), encoding="utf-8")
        finally:
            os.chdir(cwd)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--outputs", action="store_true",
                       help="only the expected outputs, from the stored inputs")
    which.add_argument("--synthetic", action="store_true",
                       help="the synthetic inputs and the expected outputs (the stored real "
                            "runs kept)")
    opts = parser.parse_args()
    if not opts.outputs:
        if not opts.synthetic and (HERE / "inputs").exists():
            shutil.rmtree(HERE / "inputs")
        with tempfile.TemporaryDirectory() as tmp:
            plain = Path(tmp) / "inputs"
            plain.mkdir()
            for name, doc in synthetic_inputs().items():
                (plain / f"{name}.json").write_text(json.dumps(doc) + "\n", encoding="utf-8")
            if not opts.synthetic:
                work = Path(tmp) / "work"
                work.mkdir()
                real_inputs(work, plain)
            store_inputs(plain)
    write_outputs()


if __name__ == "__main__":
    main()
