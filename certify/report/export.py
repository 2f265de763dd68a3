"""Release exports: Hugging Face ``model-index`` front matter and a Markdown summary.

Both are views of results.json; neither is signed on its own (the card and results.json.sig
are what an auditor verifies), so both name the results digest they were made from. Names
are escaped for Markdown, and no absolute local path is written.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import yaml

from certify.canonical import canonical_json
from certify.checks import CHECKS
from certify.redact import redact
from certify.report.card import headline
from certify.results import RunResult

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


def results_digest(result: RunResult) -> str:
    """sha256 of the canonical results payload."""
    return "sha256:" + hashlib.sha256(canonical_json(result.to_json())).hexdigest()


def model_index(result: RunResult) -> str:
    """A model card's YAML front matter with a ``model-index`` entry per check."""
    m = result.measurement
    metrics = []
    for c in result.checks:
        export = CHECKS[c.kind].export
        if c.status in ("ERROR", "SKIPPED") or export is None:
            continue
        value = getattr(c.metrics, export.metric, None)
        if value is None:
            continue
        metrics.append({"type": export.type, "value": value,
                        "name": local_free(f"{export.label}: {c.id}"), "verified": False})
    doc: dict[str, Any] = {"model-index": [{
        "name": local_free(m.model.name),
        "results": [{
            "task": {"type": "image-classification", "name": "Image Classification"},
            "dataset": {"name": local_free(f"{m.suite.name} ({m.data.name})"),
                        "type": m.suite.name},
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
        f"## Robustness card: {md(m.model.name)}",
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
