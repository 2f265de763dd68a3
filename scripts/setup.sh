#!/usr/bin/env bash
# Installs everything certify needs on a fresh Debian/Ubuntu machine: the system libraries
# WeasyPrint renders PDFs with, poppler-utils and Chromium for the card tests, a virtual
# environment in .venv, and certify with its test dependencies. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# WeasyPrint's libraries, poppler-utils (pdftoppm/pdftotext), Chromium for the card and web UI
# tests, and PostgreSQL for the service's tests (each test starts its own cluster)
debs=(libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz-subset0 fonts-dejavu-core poppler-utils
      chromium postgresql)
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

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
if ! .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]" \
    >.venv/pip-install.log 2>&1; then
  grep -v "is ignored: it is neither a file nor a directory" .venv/pip-install.log >&2
  exit 1
fi
.venv/bin/python -c "import certify, onnxruntime, weasyprint, torch" \
  || { echo "setup: certify's dependencies failed to import" >&2; exit 1; }

# MLServer for the HTTP end-to-end tests, in its own environment (it needs protobuf < 7)
if [ ! -x .venv-mlserver/bin/mlserver ]; then
  "$python" -m venv .venv-mlserver
  if ! .venv-mlserver/bin/python -m pip install -q --disable-pip-version-check \
      "mlserver==1.7.1" onnxruntime numpy >.venv-mlserver/pip-install.log 2>&1; then
    grep -v "is ignored: it is neither a file nor a directory" .venv-mlserver/pip-install.log >&2
    exit 1
  fi
fi
