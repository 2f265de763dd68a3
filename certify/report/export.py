"""Release exports: Hugging Face ``model-index`` front matter and a Markdown summary.

Both are views of results.json; neither is signed on its own (the card and results.json.sig
are what an auditor verifies), so both name the results digest they were made from.
"""

from __future__ import annotations

import hashlib
from typing import Any

import yaml

from certify.report.card import headline
from certify.report.payload import canonical_json

_METRIC = {
    "clean_accuracy": ("accuracy", "accuracy", "Clean accuracy"),
    "coverage": ("accuracy_at_coverage", "accuracy", "Accuracy at coverage"),
    "corruption": ("robustness_score", "robustness_score", "Robustness score"),
    "corruption_pair": ("robustness_score", "robustness_score", "Joint robustness score"),
    "attack": ("robust_accuracy", "robust_accuracy", "Robust accuracy"),
    "brittleness": ("brittle_score", "brittle_score", "Brittle score (LIME)"),
}


def results_digest(results: dict[str, Any]) -> str:
    """sha256 of the canonical results payload."""
    return "sha256:" + hashlib.sha256(canonical_json(results)).hexdigest()


def model_index(results: dict[str, Any]) -> str:
    """A model card's YAML front matter with a ``model-index`` entry per check."""
    metrics = []
    for c in results["checks"]:
        if c["status"] == "ERROR" or c["kind"] not in _METRIC:
            continue
        key, mtype, label = _METRIC[c["kind"]]
        if key not in c["metrics"]:
            continue
        metrics.append({"type": mtype, "value": c["metrics"][key],
                        "name": f"{label}: {c['id']}", "verified": False})
    doc = {"model-index": [{
        "name": results["model"]["name"],
        "results": [{
            "task": {"type": "image-classification", "name": "Image Classification"},
            "dataset": {"name": f"{results['suite']['name']} ({results['data']['source']})",
                        "type": results["suite"]["name"]},
            "metrics": metrics,
            "source": {"name": f"certify {results['certify_version']}, results "
                               f"{results_digest(results)}"},
        }],
    }]}
    return "---\n" + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True) + "---\n"


def markdown_summary(results: dict[str, Any]) -> str:
    """A short Markdown table of verdicts for a release page."""
    lines = [
        f"## Robustness card: {results['model']['name']}",
        "",
        f"Overall verdict: **{results['verdict']}** (suite `{results['suite']['name']}`, "
        f"certify {results['certify_version']}, {results['data']['n']} samples).",
        "",
        "| check | result | verdict |",
        "|---|---|---|",
    ]
    for c in results["checks"]:
        text = headline(c).replace("|", "\\|")
        lines.append(f"| {c['id']} | {text} | {c['status']} |")
    lines += ["", f"Model `{results['model']['identity']}`; results "
              f"`{results_digest(results)}`. Verify the attached card with "
              "`certify verify card.pdf --pubkey KEY.pub`.", ""]
    return "\n".join(lines)
