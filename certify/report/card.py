"""The robustness model card: jinja2 HTML (autoescaped, StrictUndefined) and WeasyPrint PDF."""

from __future__ import annotations

import importlib.resources
import io
import logging
from typing import Any

import jinja2

from certify.report.payload import normalize, script_safe_json

log = logging.getLogger("certify")

#: Check families the card knows about, with the issue that brings them; shown under
#: "Limitations" when a suite does not run them.
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "clean": ("Clean accuracy", ("clean_accuracy",)),
    "corruption": ("Corruption properties (noise, geometric, colour, stickers)",
                   ("corruption", "corruption_pair")),
    "attack": ("Query-based attacks validated by the binarization test", ("attack",)),
    "brittleness": ("Black-box brittle score (LIME)", ("brittleness",)),
    "confidence": ("Coverage, confident mistakes and suspect-model checks",
                   ("coverage", "sanity")),
}


def _environment() -> jinja2.Environment:
    root = importlib.resources.files("certify._templates")
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: (root / name).read_text(encoding="utf-8")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["pct"] = lambda v: "–" if v is None else f"{100 * float(v):.1f}%"
    env.filters["num"] = lambda v, d=3: "–" if v is None else f"{float(v):.{d}f}"
    return env


def per_class_svg(per_class: list[dict[str, Any]]) -> str:
    """A bar chart of per-class accuracy as inline SVG (deterministic ids, no timestamp)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.hashsalt": "certify", "svg.fonttype": "none",
                                "font.size": 7}):
        fig, ax = plt.subplots(figsize=(7.2, 2.0))
        classes = [r["class"] for r in per_class]
        acc = [r["accuracy"] for r in per_class]
        colors = ["#2e7d32" if a >= 0.9 else "#f9a825" if a >= 0.7 else "#c62828" for a in acc]
        ax.bar([str(c) for c in classes], acc, color=colors, width=0.8)
        ax.set_ylim(0, 1.02)
        ax.set_ylabel("accuracy")
        ax.set_xlabel("class id")
        ax.tick_params(axis="x", labelsize=5)
        return _svg(fig, ax)


def _svg(fig: Any, ax: Any) -> str:
    """Finish a figure and return it as inline SVG (no XML header, no timestamp)."""
    import matplotlib.pyplot as plt

    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * float(v):.1f}%"


def headline(c: dict[str, Any]) -> str:
    """One line that says what a check measured (the card's summary and the CLI's)."""
    if c["status"] == "ERROR":
        return f"error: {c['error']}"
    m, iv = c["metrics"], c["intervals"]
    if c["kind"] == "clean_accuracy":
        lo, hi = iv["accuracy"]
        return f"accuracy {_pct(m['accuracy'])} (95% CI {_pct(lo)}–{_pct(hi)})"
    if c["kind"] == "corruption":
        lo, hi = iv["robustness_score"]
        d = c["details"]
        return (f"robustness {_pct(m['robustness_score'])} (95% CI {_pct(lo)}–{_pct(hi)}) "
                f"within {d['bound']:g} {d['unit']}, n={m['n_evaluated']}")
    if c["kind"] == "corruption_pair":
        return (f"joint robustness {_pct(m['robustness_score'])}; alone "
                f"{_pct(m['score_first'])} and {_pct(m['score_second'])}; change vs weaker "
                f"{100 * m['change_vs_weaker']:+.1f} points")
    if c["kind"] == "coverage":
        return (f"accuracy {_pct(m['accuracy_at_coverage'])} at {_pct(m['coverage'])} coverage "
                f"(full coverage {_pct(m['accuracy_full_coverage'])}); confident mistakes "
                f"{_pct(m['confident_mistake_rate'])} at ≥ "
                f"{c['details']['confidence_threshold']:g}")
    if c["kind"] == "sanity":
        found = len(c.get("warnings", []))
        return (f"{found} suspect behaviour(s) found" if found else "no suspect behaviour "
                "found (randomness, saturation, probability outputs)") + f" on {m['n']} samples"
    if c["kind"] == "brittleness":
        text = f"brittle score {m['brittle_score']:.4g} on {m['n']} samples"
        if "relative_improvement" in m:
            text += (f"; reference {m['reference_brittle_score']:.4g}, "
                     f"R.I. {100 * m['relative_improvement']:+.1f}%")
        return text
    if c["kind"] == "attack":
        lo, hi = iv["robust_accuracy"]
        d = c["details"]
        bound = "spatial grid" if d["norm"] == "spatial" else f"{d['norm']} ε={d['epsilon']:.4g}"
        text = (f"robust accuracy {_pct(m['robust_accuracy'])} (95% CI {_pct(lo)}–{_pct(hi)}) "
                f"under {d['attack']} at {bound}, ≤{d['max_queries']} queries")
        if d.get("binarization"):
            text += (f"; binarization test {m['binarization_score']:.2f} "
                     f"(R-ASR {m['binarization_rasr']:.2f})")
        return text
    return ", ".join(f"{k}={v}" for k, v in m.items())


def curve_svg(curve: list[dict[str, Any]], unit: str) -> str:
    """Robustness score as a function of the intensity bound, as inline SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(p["intensity"], p["score"]) for p in curve if p["score"] is not None]
    with matplotlib.rc_context({"svg.hashsalt": "certify", "svg.fonttype": "none",
                                "font.size": 7}):
        fig, ax = plt.subplots(figsize=(2.6, 1.6))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=2.5,
                    color="#1565c0", linewidth=1.2, drawstyle="steps-post")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel(unit)
        ax.set_ylabel("robustness")
        return _svg(fig, ax)


def card_context(results: dict[str, Any], signature: Any = None) -> dict[str, Any]:
    """Everything the template shows, computed from the results document alone."""
    results = normalize(results)
    kinds = {c["kind"] for c in results["checks"]}
    not_tested = [
        {"family": label, "why": "not in this suite" if known else "not yet supported by "
         f"certify {results['certify_version']}"}
        for _, (label, known) in FAMILIES.items()
        if not kinds.intersection(known)
    ]
    figures: dict[str, str] = {}
    for c in results["checks"]:
        if c["status"] == "ERROR":
            continue
        if c["kind"] == "clean_accuracy":
            figures[c["id"]] = per_class_svg(c["details"]["per_class"])
        elif c["kind"] == "corruption":
            figures[c["id"]] = curve_svg(c["details"]["curve"], c["details"]["unit"])
    corruption = [c for c in results["checks"] if c["kind"] == "corruption"]
    pairs = [c for c in results["checks"] if c["kind"] == "corruption_pair"]
    attacks = [c for c in results["checks"] if c["kind"] == "attack"]
    brittle = [c for c in results["checks"] if c["kind"] == "brittleness"]
    warnings = [{"check": c["id"], "text": w} for c in results["checks"]
                for w in c.get("warnings", [])]
    return {
        "r": results,
        "not_tested": not_tested,
        "figures": figures,
        "headlines": {c["id"]: headline(c) for c in results["checks"]},
        "corruption": corruption,
        "pairs": pairs,
        "attacks": attacks,
        "brittle": brittle,
        "warnings": warnings,
        "payload": script_safe_json(results),
        "signature": signature,
        "signature_json": "null" if signature is None else signature.to_json().strip()
        .replace("<", "\\u003c"),
    }


def render_html(results: dict[str, Any], signature: Any = None) -> str:
    """The self-contained card HTML."""
    env = _environment()
    css = (importlib.resources.files("certify._templates") / "card.css").read_text("utf-8")
    ctx = card_context(results, signature)
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
