"""Sphinx configuration of certify's documentation site (MyST Markdown, the Furo theme).

Build it with ``bash scripts/docs.sh`` (builds and serves it on 127.0.0.1) or
``sphinx-build -W --keep-going -b html docs docs/_build/html``; tests/test_docs.py builds it
with warnings as errors. The references are generated at build time (``_ext/certify_docs.py``
writes ``_generated/``; sphinx-click and autodoc read the code), so they cannot drift.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the checkout's certify, also when it is not installed
sys.path.insert(0, str(HERE / "_ext"))

from certify.version import __version__  # noqa: E402

project = "certify"
author = "the certify authors"
copyright = "the certify authors"  # noqa: A001 - Sphinx's name
release = __version__
version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_click",
    "certify_docs",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "_ext", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist", "attrs_inline"]
# no smart quotes: a pasted example must run (with them, `--suite` became `–suite` and quotes
# curly ones in the generated CLI reference, and click answered "Missing option '--suite'")
smartquotes = False
myst_heading_anchors = 3

autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_preserve_defaults = True

html_theme = "furo"
html_title = f"certify {__version__}"
html_static_path: list[str] = []
html_copy_source = False
html_show_sourcelink = False
