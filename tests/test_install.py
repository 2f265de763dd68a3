"""Install like a Python tool: where WeasyPrint cannot load its system libraries (a plain
``pip install .`` on a machine without Pango), the card is still written and one line says how
to get the PDF.

The failure is made as the real one happens: ``import weasyprint`` raises the ``OSError`` that
cffi's ``dlopen`` raises in ``weasyprint/text/ffi.py`` when libgobject/libpango are missing (a
meta-path finder raises it for every ``weasyprint`` module). The demo runs in-process on a
one-check suite (clean accuracy over the 43 classes), so the whole module costs seconds.
"""

from __future__ import annotations

import datetime as dt
import importlib.abc
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import builders

pytestmark = pytest.mark.e2e

#: cffi's message when the library is missing (the first line of it).
DLOPEN_ERROR = ("cannot load library 'libgobject-2.0-0': libgobject-2.0-0: cannot open shared "
                "object file: No such file or directory")


class _NoPango(importlib.abc.MetaPathFinder):
    """Fails ``import weasyprint`` as a machine without Pango/GObject does."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name == "weasyprint" or name.startswith("weasyprint."):
            raise OSError(DLOPEN_ERROR)
        return None


def _block(mp: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "weasyprint" or m.startswith("weasyprint.")]:
        mp.delitem(sys.modules, name)
    mp.setattr(sys, "meta_path", [_NoPango(), *sys.meta_path])


@pytest.fixture
def no_weasyprint() -> Iterator[None]:
    """WeasyPrint cannot load while the test runs (restored afterwards)."""
    with pytest.MonkeyPatch.context() as mp:
        _block(mp)
        yield


@pytest.fixture(scope="module")
def clean_suite(tmp_path_factory) -> Path:
    """The packaged gtsrb suite cut to its clean-accuracy check (seconds on the demo model)."""
    from certify.suite import resolve_suite_path

    raw = yaml.safe_load(resolve_suite_path("gtsrb").read_text())
    raw["name"], raw["checks"] = "gtsrb-clean", [c for c in raw["checks"]
                                                 if c["kind"] == "clean_accuracy"]
    path = tmp_path_factory.mktemp("install-suite") / "clean.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def demo_without_pdf(clean_suite, tmp_path_factory) -> tuple[Path, Any]:
    """``certify demo`` where WeasyPrint cannot load: (run folder, the CLI's result)."""
    out = tmp_path_factory.mktemp("no-weasyprint") / "card"
    with pytest.MonkeyPatch.context() as mp:
        _block(mp)
        proc = builders.run_cli("demo", "--suite", clean_suite, "--out", out)
    return out, proc


def _hints(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "card.pdf" in line]


def test_demo_without_weasyprint_writes_the_html_card_and_one_line_hint(demo_without_pdf,
                                                                         clean_suite):
    out, proc = demo_without_pdf
    assert proc.returncode == 0, proc.stderr
    assert (out / "card.html").is_file() and (out / "results.json").is_file()
    assert not (out / "card.pdf").exists()
    (hint,) = _hints(proc.stderr)  # exactly one line on how to get the PDF
    assert hint.startswith("card.pdf not written: WeasyPrint cannot load its system "
                           "libraries (OSError: cannot load library 'libgobject-2.0-0')")
    assert ("apt-get install libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz-subset0 "
            "fonts-dejavu-core") in hint
    assert hint.endswith(f"rerun certify demo --out {out} --suite {clean_suite} --resume")
    assert "pdf:" not in proc.stdout and "html: " in proc.stdout
    assert "-----" not in proc.stdout  # WeasyPrint's own banner is not printed
    renderer = json.loads((out / "results.json").read_text())["provenance"]["renderer"]
    assert renderer["weasyprint"].startswith("unavailable (")
    assert "cannot load library 'libgobject-2.0-0'" in renderer["weasyprint"]


def test_no_pdf_stays_silent_and_the_hint_s_resume_adds_the_pdf(demo_without_pdf, clean_suite,
                                                                  tmp_path):
    out = tmp_path / "card"
    shutil.copytree(demo_without_pdf[0], out)
    with pytest.MonkeyPatch.context() as mp:
        _block(mp)
        proc = builders.run_cli("demo", "--suite", clean_suite, "--out", out, "--resume",
                                "--no-pdf")
    assert proc.returncode == 0, proc.stderr
    assert not _hints(proc.stderr)
    # what the hint says, once the libraries load: the same command with --resume adds it
    proc = builders.run_cli("demo", "--suite", clean_suite, "--out", out, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert (out / "card.pdf").read_bytes().startswith(b"%PDF") and not _hints(proc.stderr)
    assert builders.measurement(out) == builders.measurement(demo_without_pdf[0])


def test_sign_verify_and_compare_without_weasyprint(demo_without_pdf, no_weasyprint, tmp_path):
    out = tmp_path / "card"
    shutil.copytree(demo_without_pdf[0], out)
    assert builders.run_cli("keygen", "--out", tmp_path / "keys").returncode == 0
    proc = builders.run_cli("sign", out, "--key", tmp_path / "keys" / "certify.key")
    assert proc.returncode == 0, proc.stderr
    (hint,) = _hints(proc.stderr)
    assert hint.endswith("and run certify sign again")
    assert (out / "results.json.sig").is_file() and not (out / "card.pdf").exists()
    # the HTML card verifies without WeasyPrint (it is not needed to check it)
    proc = builders.run_cli("verify", out / "card.html", "--pubkey",
                            tmp_path / "keys" / "certify.pub")
    assert proc.returncode == 0, proc.stderr
    # compare --pdf asked for a PDF explicitly: a clear error, the other outputs still written
    proc = builders.run_cli("compare", out, demo_without_pdf[0], "--html",
                            tmp_path / "c.html", "--pdf", tmp_path / "c.pdf")
    assert proc.returncode == 2
    assert "cannot render a PDF: WeasyPrint cannot load its system libraries" in proc.stderr
    assert (tmp_path / "c.html").is_file() and not (tmp_path / "c.pdf").exists()


def test_service_links_only_the_files_a_run_wrote():
    from certify.service.db import Run
    from certify.service.shared import run_json

    def links(progress: dict[str, Any]) -> set[str]:
        run = Run(id="r1", seq=1, state="done", model_kind="onnx", model_ref="m",
                  model_name="m", suite="gtsrb", suite_name="gtsrb", dataset="d",
                  options={}, progress=progress, attempts=0,
                  created=dt.datetime(2026, 1, 1), updated=dt.datetime(2026, 1, 1))
        return set(run_json(run)["links"])

    written = ["card.html", "results.json", "results.json.sig"]
    assert "card.pdf" not in links({"files": written})
    assert {"card.html", "results.json", "results.json.sig"} <= links({"files": written})
    assert "card.pdf" in links({})  # a run recorded before the files were kept
