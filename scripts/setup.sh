#!/usr/bin/env bash
# Sets certify up from this checkout. Safe to run again.
#
#   bash scripts/setup.sh          what `certify demo` and `certify run` need: WeasyPrint's system
#                                  libraries (card.pdf) on Debian/Ubuntu, a virtual environment in
#                                  .venv, certify installed into it (editable)
#   bash scripts/setup.sh --test   that, plus what the tests need (scripts/test.sh runs this):
#                                  poppler-utils, libnss3-tools, Chromium, PostgreSQL, certify's
#                                  [test] extra and MLServer in its own environment
#                                  (.venv-mlserver)
#
# certify itself needs no set-up script: `pip install .` installs it and its Python dependencies.
# Where WeasyPrint's libraries are missing (no apt-get here, or not installed), `certify demo` and
# `certify run` write card.html and results.json and print one line on how to get card.pdf.
set -euo pipefail
cd "$(dirname "$0")/.."

tests=0
case "${1:-}" in
  "") ;;
  --test) tests=1 ;;
  *) echo "usage: bash scripts/setup.sh [--test]" >&2; exit 2 ;;
esac

# WeasyPrint's libraries (keep in step with certify/report/weasy.py's PDF_PACKAGES); for the
# tests also poppler-utils (pdftoppm/pdftotext, pdfsig), libnss3-tools (certutil: an NSS database
# that trusts a card's certificate, for pdfsig), Chromium for the card and web UI tests, and
# PostgreSQL for the service's tests (each test starts its own cluster)
debs=(libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz-subset0 fonts-dejavu-core)
((tests)) && debs+=(poppler-utils libnss3-tools chromium postgresql)
if command -v dpkg-query >/dev/null && command -v apt-get >/dev/null; then
  missing=()
  for p in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "setup: installing Debian packages: ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  fi
elif ((tests)); then
  echo "setup: the tests need Debian/Ubuntu packages (apt-get): ${debs[*]}" >&2
  exit 1
else
  echo "setup: no apt-get here: install WeasyPrint's libraries (Pango, HarfBuzz, fontconfig) your" \
       "own way for card.pdf; without them the card is written as card.html"
fi

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
target="."
((tests)) && target=".[test]"
if ! .venv/bin/python -m pip install -q --disable-pip-version-check -e "$target" \
    >.venv/pip-install.log 2>&1; then
  grep -v "is ignored: it is neither a file nor a directory" .venv/pip-install.log >&2
  exit 1
fi
.venv/bin/python -c "import certify, onnxruntime, torch" \
  || { echo "setup: certify's dependencies failed to import" >&2; exit 1; }
if command -v apt-get >/dev/null; then  # the libraries were installed above: card.pdf must work
  .venv/bin/python -c "from certify.report.weasy import load_weasyprint; load_weasyprint()" \
    || { echo "setup: WeasyPrint cannot load its libraries" >&2; exit 1; }
fi
((tests)) || exit 0

# MLServer for the HTTP end-to-end tests, in its own environment (it needs protobuf < 7)
if [ ! -x .venv-mlserver/bin/mlserver ]; then
  "$python" -m venv .venv-mlserver
  if ! .venv-mlserver/bin/python -m pip install -q --disable-pip-version-check \
      "mlserver==1.7.1" onnxruntime numpy >.venv-mlserver/pip-install.log 2>&1; then
    grep -v "is ignored: it is neither a file nor a directory" .venv-mlserver/pip-install.log >&2
    exit 1
  fi
fi
