"""card.pdf signing does not depend on what the process did before: a PDF signature checked
before asn1crypto's ``tsp`` module was imported once left pyHanko's next signing failing with
"invalid literal for int(): 'signing_certificate_v2'" (found when the test order changed: an
in-process `certify verify` followed by `certify run --sign-key`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e  # a fresh interpreter: tsp must not be imported yet

SCRIPT = r"""
import io
from asn1crypto import cms
cms.CMSAttributeType.unmap("content_type")   # the name map is built now, without tsp's names
import asn1crypto.tsp                         # registers signing_certificate_v2, too late
from cryptography.hazmat.primitives.asymmetric import ec
from pypdf import PdfWriter
from certify.report.pades import PdfSigningKey, self_issued_certificate, sign_pdf
from certify.report.pades import verify_pdf_signature
w = PdfWriter(); w.add_blank_page(100, 100); buf = io.BytesIO(); w.write(buf)
key = ec.generate_private_key(ec.SECP256R1())
signed = sign_pdf(buf.getvalue(), PdfSigningKey(key, self_issued_certificate(key)))
print(verify_pdf_signature(signed, key.public_key(), "card.pdf").byte_range[0])
"""


def test_signing_after_a_stale_cms_name_map() -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "0"
