"""Release exports: Hugging Face ``model-index`` front matter and a Markdown summary.

Both are views of results.json; neither is signed on its own (the card and results.json.sig
are what an auditor verifies), so both name the results digest they were made from. Names
are escaped for Markdown, and no absolute local path is written.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import yaml

from certify.canonical import canonical_json
from certify.kinds import KINDS, ExportMetric
from certify.redact import redact
from certify.report.card import headline
from certify.report.sign import part_digest
from certify.results import CheckResult, RunResult

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#!{}])")
_ABS_PATH = re.compile(r"(?<![\w:/.~-])(?:/[^\s/|`'\"<>]+)+/(?P<name>[^\s/|`'\"<>]*)")


def local_free(text: str) -> str:
    """``text`` with credentials redacted and absolute local paths cut to their base names."""
    return _ABS_PATH.sub(lambda m: m["name"] or "local folder", redact(text))


def md(text: object) -> str:
    """Markdown-safe inline text: one line, no markup, links, HTML or absolute local paths."""
    s = local_free(str(text)).replace("\r\n", " ").replace("\r", " ").replace("\n", " ")
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", s)


def display_name(result: RunResult) -> str:
    """The model's name as its team stated it (``--model-name``), else the file or endpoint
    name certify saw."""
    card = result.measurement.model_card
    return card.name if card is not None and card.name else result.measurement.model.name


def results_digest(result: RunResult) -> str:
    """sha256 of the canonical results payload."""
    return "sha256:" + hashlib.sha256(canonical_json(result.to_json())).hexdigest()


#: Front-matter key under which the export carries what the card's digests and identities are;
#: ``huggingface_hub``'s ``ModelCard.load(...).data.to_dict()`` keeps unknown top-level keys.
CERTIFY_KEY = "certify"
#: ``dataset.type`` of local data: deliberately not a Hub dataset id, so that no leaderboard
#: files a local copy (or a generated set) under a public benchmark it may not be.
LOCAL_DATASET_TYPE = "local-data"
DEMO_DATASET_TYPE = "certify-synthetic-traffic-signs"
_DEMO_DATA_FILE = "synthetic-gtsrb-test.npz"


def _is_demo_data(result: RunResult) -> bool:
    """True for the set `certify demo` generates (its file name in its demo-data folder)."""
    from certify.rundir import DEMO_DATA

    source = Path(result.provenance.data_source or "")
    return (result.measurement.data.name == _DEMO_DATA_FILE
            and source.name == _DEMO_DATA_FILE and source.parent.name == DEMO_DATA)


def dataset_entry(result: RunResult, dataset_id: str | None = None,
                  split: str | None = None) -> dict[str, str]:
    """The ``dataset`` of a model-index result: what the evaluation data is.

    A Hub dataset id is written only when the caller names one (``dataset_id``: the person
    exporting asserts the data is that dataset); otherwise the data is named as local data by
    its file name and digest (the demo's as generated, synthetic data), never by a path.
    """
    d = result.measurement.data
    short = d.digest.split(":")[-1][:12]
    if dataset_id:
        entry = {"name": local_free(dataset_id), "type": local_free(dataset_id)}
        if split:
            entry["split"] = local_free(split)
    elif _is_demo_data(result):
        entry = {"name": f"certify demo: synthetic traffic signs ({d.n} generated images, "
                         f"not GTSRB)", "type": DEMO_DATASET_TYPE}
    else:
        entry = {"name": local_free(f"{d.name}: local data ({d.n} images, {d.layout}, "
                                    f"sha256 {short})"), "type": LOCAL_DATASET_TYPE}
    return entry


def _metric(c: CheckResult, export: ExportMetric, value: float) -> dict[str, object]:
    """One model-index metric: the check's exported value, with its interval, threshold and
    sample count as ``args``."""
    lo, hi = c.intervals.get(export.metric, (None, None))
    args: dict[str, object] = {"check": local_free(c.id), "kind": c.kind, "verdict": c.status}
    if lo is not None and hi is not None:
        args["ci95"] = [lo, hi]
    if c.threshold is not None:
        args["threshold"] = local_free(c.threshold.text)
    n = getattr(c.metrics, "n", None)
    if isinstance(n, int):
        args["n"] = n
    return {"type": export.type, "value": value, "name": local_free(f"{export.label}: {c.id}"),
            "args": args}


def front_matter(result: RunResult, *, dataset_id: str | None = None,
                 split: str | None = None, source_url: str | None = None
                 ) -> dict[str, object]:
    """The model card metadata: a ``model-index`` entry per check and the card's digests.

    ``verified``/``verify_token`` are left to the Hub (they mark its own evaluation service).
    A ``source`` is written only with a ``source_url`` (the Hub requires the pair), e.g. the
    release's card.pdf; the results digest is always under the top-level ``certify`` key.
    """
    m = result.measurement
    metrics = []
    for c in result.checks:
        export = KINDS[c.kind].export
        if c.status in ("ERROR", "SKIPPED") or export is None:
            continue
        value = getattr(c.metrics, export.metric, None)
        if value is None:
            continue
        metrics.append(_metric(c, export, value))
    digest = results_digest(result)
    entry: dict[str, object] = {
        "task": {"type": "image-classification", "name": "Image Classification"},
        "dataset": dataset_entry(result, dataset_id, split),
        "metrics": metrics,
    }
    if source_url:
        entry["source"] = {"name": f"certify {m.certify_version} robustness card ({digest})",
                           "url": source_url}
    card = m.model_card
    stated: dict[str, str] = {}
    if card is not None:  # model details as the team stated them on the run
        stated = {k: local_free(v) for k, v in (("model_version", card.version),
                                                 ("owner", card.owner),
                                                 ("intended_use", card.intended_use))
                  if v is not None}
    doc: dict[str, object] = {}
    if card is not None and card.license is not None:
        doc["license"] = local_free(card.license)
    return doc | {
        "model-index": [{"name": local_free(display_name(result)), "results": [entry]}],
        CERTIFY_KEY: stated | {
            "results_digest": digest,
            "measurement_digest": part_digest(result.to_json(), "measurement"),
            "certify_version": m.certify_version,
            "suite": local_free(m.suite.name),
            "suite_digest": m.suite.digest,
            "data_digest": m.data.digest,
            "model_identity": m.model.identity,
            "verdict": m.verdict,
            "verify": "certify verify card.pdf --pubkey KEY.pub",
        },
    }


def model_index(result: RunResult, *, dataset_id: str | None = None, split: str | None = None,
                source_url: str | None = None) -> str:
    """A Hugging Face model card's YAML front matter (to head the model's README.md).

    It loads with ``huggingface_hub.ModelCard.load`` and its ``model-index`` with
    ``model_index_to_eval_results``.
    """
    doc = front_matter(result, dataset_id=dataset_id, split=split, source_url=source_url)
    return "---\n" + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True) + "---\n"


def markdown_summary(result: RunResult) -> str:
    """A short Markdown table of verdicts for a release page."""
    m = result.measurement
    lines = [
        f"## Robustness card: {md(display_name(result))}"
        + (f" {md(m.model_card.version)}" if m.model_card and m.model_card.version else ""),
        "",
        f"Overall verdict: **{md(m.verdict)}** (suite {md(m.suite.name)}, "
        f"data {md(m.data.name)}, certify {md(m.certify_version)}, {int(m.data.n)} samples).",
        "",
        "| check | result | verdict |",
        "|---|---|---|",
    ]
    for c in result.checks:
        lines.append(f"| {md(c.id)} | {md(headline(c))} | {md(c.status)} |")
    lines += ["", f"Model {md(m.model.identity)}; results "
              f"`{results_digest(result)}`. Verify the attached card with "
              "`certify verify card.pdf --pubkey KEY.pub`.", ""]
    return "\n".join(lines)
