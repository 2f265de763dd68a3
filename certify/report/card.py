"""The robustness model card: jinja2 HTML (autoescaped, StrictUndefined) and WeasyPrint PDF.

The card is a view of a typed :class:`~certify.results.RunResult`. Each check kind presents
itself (headline, figures, its section template ``templates/checks/<kind>.html.j2``); this
module only iterates over the kinds a run has, in registry order. Images are looked up by the
pixel digest the signed measurement records (see :mod:`certify.images`).
"""

from __future__ import annotations

import importlib.resources
import logging
from collections.abc import Mapping
from typing import Any

import jinja2
import markupsafe

from certify.canonical import script_safe_json
from certify.checks import CHECKS
from certify.report import glance
from certify.results import RunResult
from certify.suite import DECISION_RULE_TEXT


def _environment() -> jinja2.Environment:
    root = importlib.resources.files("certify._templates")
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(
            lambda name: root.joinpath(*name.split("/")).read_text(encoding="utf-8")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["pct"] = lambda v: "–" if v is None else f"{100 * float(v):.1f}%"
    env.filters["num"] = lambda v, d=3: "–" if v is None else f"{float(v):.{d}f}"
    return env


def headline(c: Any) -> str:
    """One line that says what a check measured (the card's summary and the CLI's)."""
    if c.status == "ERROR":
        return f"error: {c.error}"
    if c.status == "SKIPPED":
        return f"skipped: {c.decision}"
    text = CHECKS[c.kind].headline(c)
    if c.sample_errors:
        text += f"; {c.sample_errors} sample(s) errored"
    return text


def renderer_info() -> dict[str, str]:
    """What renders the card, recorded in provenance (a card made by another renderer still
    verifies on its visible text)."""
    import jinja2 as j
    import weasyprint

    import certify

    return {"certify": certify.__version__, "jinja2": j.__version__,
            "weasyprint": weasyprint.__version__}


def _glance(checks: list[Any], worst: list[Any]) -> dict[str, Any]:
    svg = glance.glance_svg(checks)
    return {"svg": svg, "alt": glance.alt_text(checks), "worst": glance.worst_case_line(worst),
            "width_mm": glance.print_width_mm(svg)}


def card_context(result: RunResult, signature: Any = None,
                 images: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Everything the template shows, computed from the result (and the images it names)."""
    images = images or {}
    m, p = result.measurement, result.provenance
    checks = result.checks
    kinds = {c.kind for c in checks}
    families = list(dict.fromkeys(cls.family for cls in CHECKS.values()))
    present = {CHECKS[k].family for k in kinds}
    not_tested = [{"family": f, "why": "not in this suite"} for f in families
                  if f not in present]
    figures: dict[str, dict[str, str]] = {}
    for c in checks:
        figures[c.id] = {} if c.status in ("ERROR", "SKIPPED") else CHECKS[c.kind].figures(c)
    sections = [{"kind": kind, "partial": cls.partial(),
                 "checks": [c for c in checks if c.kind == kind],
                 "figures": cls.section_figures([c for c in checks if c.kind == kind])}
                for kind, cls in CHECKS.items() if kind in kinds]
    warnings = [{"check": c.id, "text": w} for c in checks for w in c.warnings]
    rule = {"name": m.suite.decision, "text": DECISION_RULE_TEXT[m.suite.decision],
            "others": [{"check": c.id, "name": c.threshold.rule, "text":
                        DECISION_RULE_TEXT[c.threshold.rule]} for c in checks
                       if c.threshold is not None and c.threshold.rule != m.suite.decision]}

    def img(digest: str, alt: str) -> markupsafe.Markup:
        """An <img> of a signed image; ``data-digest`` says which pixels it must show."""
        src = images.get(digest, "")
        return markupsafe.Markup('<img src="{}" alt="{}" data-digest="{}">').format(
            src, alt, digest)

    skipped = [c for c in checks if c.status == "SKIPPED"]
    return {
        "r": result,
        "skipped": skipped,
        "skipped_why": ("model returns labels only" if skipped and m.model.output == "labels"
                        else "not evaluable on this model"),
        "m": m,
        "p": p,
        "not_tested": not_tested,
        "figures": figures,
        "headlines": {c.id: headline(c) for c in checks},
        "glance": _glance(checks, m.attack_worst_case),
        "sections": sections,
        "warnings": warnings,
        "decision_rule": rule,
        "img": img,
        "payload": script_safe_json(result.to_json()),
        "signature": signature,
        "signature_json": "null" if signature is None else signature.to_json().strip()
        .replace("<", "\\u003c"),
    }


def render_html(result: RunResult, signature: Any = None,
                images: Mapping[str, str] | None = None) -> str:
    """The self-contained card HTML; ``images`` maps digests to data URIs."""
    env = _environment()
    css = (importlib.resources.files("certify._templates") / "card.css").read_text("utf-8")
    ctx = card_context(result, signature, images)
    return env.get_template("card.html.j2").render(css=css, **ctx)


def render_pdf(html: str, payload: bytes, signature: Any = None) -> bytes:
    """Render the card HTML to PDF with WeasyPrint, attaching the payload and signature."""
    import weasyprint

    # WeasyPrint logs font-subsetting chatter at INFO/WARNING; keep it out of the user's way.
    logging.getLogger("weasyprint").setLevel(logging.ERROR)
    logging.getLogger("fontTools").setLevel(logging.ERROR)
    doc = weasyprint.HTML(string=html)
    attachment = weasyprint.Attachment(
        string=payload.decode("utf-8"), name="results.json",
        description="certify results (canonical JSON)",
    )
    attachments = [attachment]
    if signature is not None:
        attachments.append(weasyprint.Attachment(
            string=signature.to_json(), name="results.json.sig",
            description="certify signature of results.json"))
    pdf = doc.write_pdf(attachments=attachments)
    if pdf is None:
        raise RuntimeError("WeasyPrint produced no PDF")
    return pdf
