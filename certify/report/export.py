"""Release exports: Hugging Face ``model-index`` front matter and a Markdown summary.

Both are views of results.json; neither is signed on its own (the card and results.json.sig
are what an auditor verifies), so both name the results digest they were made from.
"""

from __future__ import annotations

import hashlib
from typing import Any

import yaml

from certify.canonical import canonical_json
from certify.checks import CHECKS
from certify.report.card import headline
from certify.results import RunResult


def results_digest(result: RunResult) -> str:
    """sha256 of the canonical results payload."""
    return "sha256:" + hashlib.sha256(canonical_json(result.to_json())).hexdigest()


def model_index(result: RunResult) -> str:
    """A model card's YAML front matter with a ``model-index`` entry per check."""
    m = result.measurement
    metrics = []
    for c in result.checks:
        export = CHECKS[c.kind].export
        if c.status == "ERROR" or export is None:
            continue
        value = getattr(c.metrics, export.metric, None)
        if value is None:
            continue
        metrics.append({"type": export.type, "value": value,
                        "name": f"{export.label}: {c.id}", "verified": False})
    doc: dict[str, Any] = {"model-index": [{
        "name": m.model.name,
        "results": [{
            "task": {"type": "image-classification", "name": "Image Classification"},
            "dataset": {"name": f"{m.suite.name} ({m.data.name})", "type": m.suite.name},
            "metrics": metrics,
            "source": {"name": f"certify {m.certify_version}, results "
                               f"{results_digest(result)}"},
        }],
    }]}
    return "---\n" + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True) + "---\n"


def markdown_summary(result: RunResult) -> str:
    """A short Markdown table of verdicts for a release page."""
    m = result.measurement
    lines = [
        f"## Robustness card: {m.model.name}",
        "",
        f"Overall verdict: **{m.verdict}** (suite `{m.suite.name}`, "
        f"certify {m.certify_version}, {m.data.n} samples).",
        "",
        "| check | result | verdict |",
        "|---|---|---|",
    ]
    for c in result.checks:
        text = headline(c).replace("|", "\\|")
        lines.append(f"| {c.id} | {text} | {c.status} |")
    lines += ["", f"Model `{m.model.identity}`; results "
              f"`{results_digest(result)}`. Verify the attached card with "
              "`certify verify card.pdf --pubkey KEY.pub`.", ""]
    return "\n".join(lines)
