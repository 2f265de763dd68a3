"""Release exports: Hugging Face ``model-index`` front matter and a Markdown summary.

Both are views of results.json; neither is signed on its own (the card and results.json.sig
are what an auditor verifies), so both name the results digest they were made from.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import PurePath
from typing import Any

import yaml

from certify.redact import redact
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


_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#!{}])")
_ABS_PATH = re.compile(r"(?<![\w:/.~-])(?:/[^\s/|`'\"<>]+)+/(?P<name>[^\s/|`'\"<>]*)")


def local_free(text: str) -> str:
    """``text`` with credentials redacted and absolute local paths cut to their base names."""
    return _ABS_PATH.sub(lambda m: m["name"] or "local folder", redact(text))


def md(text: Any) -> str:
    """Markdown-safe inline text: one line, no markup, links, HTML or absolute local paths."""
    s = local_free(str(text)).replace("\r\n", " ").replace("\r", " ").replace("\n", " ")
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", s)


def data_source(results: dict[str, Any]) -> str:
    """The data source as an export may name it: a base name, never an absolute local path."""
    source = str(results["data"].get("source") or "")
    if source.startswith(("http://", "https://")):
        return redact(source)
    name = PurePath(source.replace("\\", "/")).name
    return name or "local file"


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
                        "name": local_free(f"{label}: {c['id']}"), "verified": False})
    doc = {"model-index": [{
        "name": local_free(results["model"]["name"]),
        "results": [{
            "task": {"type": "image-classification", "name": "Image Classification"},
            "dataset": {"name": local_free(f"{results['suite']['name']} "
                                           f"({data_source(results)})"),
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
        f"## Robustness card: {md(results['model']['name'])}",
        "",
        f"Overall verdict: **{md(results['verdict'])}** (suite {md(results['suite']['name'])}, "
        f"data {md(data_source(results))}, certify {md(results['certify_version'])}, "
        f"{int(results['data']['n'])} samples).",
        "",
        "| check | result | verdict |",
        "|---|---|---|",
    ]
    for c in results["checks"]:
        lines.append(f"| {md(c['id'])} | {md(headline(c))} | {md(c['status'])} |")
    lines += ["", f"Model {md(results['model']['identity'])}; results "
              f"`{results_digest(results)}`. Verify the attached card with "
              "`certify verify card.pdf --pubkey KEY.pub`.", ""]
    return "\n".join(lines)
