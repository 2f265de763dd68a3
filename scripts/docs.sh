#!/usr/bin/env bash
# Builds the documentation site (docs/, Sphinx with MyST Markdown and the Furo theme) into
# docs/_build/html with warnings as errors, as tests/test_docs.py does, then serves it on
# 127.0.0.1 until Ctrl-C.
#
#   bash scripts/docs.sh                 build, then serve on a free port (printed)
#   bash scripts/docs.sh --port 8000     build, then serve on that port
#   bash scripts/docs.sh --no-serve      build only
#
# It uses .venv (bash scripts/setup.sh makes it) and installs the documentation's packages into
# it when they are missing (they are part of certify's [test] extra). The references are
# generated while the site builds (docs/_ext/certify_docs.py writes docs/_generated/).
set -euo pipefail
cd "$(dirname "$0")/.."

serve=1
port=""
while (($#)); do
  case "$1" in
    --no-serve) serve=0 ;;
    --port) port="${2:?--port needs a number}"; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: bash scripts/docs.sh [--no-serve] [--port N]" >&2; exit 2 ;;
  esac
  shift
done

python=.venv/bin/python
if [ ! -x "$python" ]; then
  echo "docs: no .venv here: run 'bash scripts/setup.sh' first" >&2
  exit 1
fi
# keep in step with the documentation's part of the [test] extra in pyproject.toml
if ! "$python" -c "import sphinx, myst_parser, furo, sphinx_click, sphinxcontrib.openapi" \
    2>/dev/null; then
  echo "docs: installing Sphinx, myst-parser, furo, sphinx-click and sphinxcontrib-openapi"
  "$python" -m pip install -q --disable-pip-version-check "sphinx>=8" "myst-parser>=4" \
    "furo>=2024.8" "sphinx-click>=6" "sphinxcontrib-openapi>=0.8"
fi

out=docs/_build/html
"$python" -m sphinx -W --keep-going -q -b html docs "$out"
echo "docs: built $out/index.html"
((serve)) || exit 0

if [ -z "$port" ]; then
  port=$("$python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); \
print(s.getsockname()[1]); s.close()")
fi
echo "docs: serving http://127.0.0.1:$port/ (Ctrl-C stops)"
exec "$python" -m http.server "$port" --bind 127.0.0.1 --directory "$out"
