"""poppler's ``pdfsig`` and NSS's ``certutil`` for the tests of card.pdf's PDF signature
(Debian poppler-utils and libnss3-tools, installed by ``scripts/setup.sh --test``)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

PDFSIG = shutil.which("pdfsig")
CERTUTIL = shutil.which("certutil")


def trusting_nss(folder: Path, cert: Path) -> Path:
    """An NSS database in ``folder`` that trusts ``cert`` as a root, for signatures too.

    ``-t "C,,"`` trusts it for SSL only, which pdfsig (a signer's usage) does not count: it
    then reports "Certificate issuer isn't Trusted" even for a genuine card; ``C,C,`` adds
    S/MIME (signatures)."""
    assert CERTUTIL is not None
    subprocess.run([CERTUTIL, "-N", "-d", f"sql:{folder}", "--empty-password"], check=True,
                   capture_output=True)
    subprocess.run([CERTUTIL, "-A", "-d", f"sql:{folder}", "-t", "C,C,", "-n", "certify",
                    "-i", str(cert)], check=True, capture_output=True)
    return folder


def pdfsig(path: Path, nss: Path) -> list[dict[str, str]]:
    """pdfsig's report on ``path`` with the NSS database ``nss`` (pdfsig always exits 0: its
    text is read), one dict per signature keyed by pdfsig's labels, plus ``total``: whether
    it says "Total document signed". No signature gives an empty list."""
    assert PDFSIG is not None
    proc = subprocess.run([PDFSIG, "-nssdir", f"sql:{nss}", str(path)], capture_output=True,
                          text=True, timeout=60)
    blocks = re.split(r"^Signature #\d+:$", proc.stdout + proc.stderr, flags=re.M)[1:]
    sigs = []
    for b in blocks:
        d = {m.group(1).strip(): m.group(2).strip()
             for m in re.finditer(r"^[ \t]+- ([^:\n]+):[ \t]*(.*)$", b, flags=re.M)}
        d["total"] = "yes" if "Total document signed" in b else "no"
        sigs.append(d)
    return sigs


def accepted_by_pdfsig(sigs: list[dict[str, str]]) -> bool:
    """Whether some signature is valid, covers the whole document and is trusted."""
    return any(s.get("Signature Validation") == "Signature is Valid." and s["total"] == "yes"
               and s.get("Certificate Validation") == "Certificate is Trusted." for s in sigs)
