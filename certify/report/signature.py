"""The signature document (``results.json.sig``): a detached ECDSA signature over a statement
of the results' digests, and the fingerprint of the key that made it.

Data only: :mod:`certify.report.sign` makes and checks signatures; the card, its seal and its
re-rendering read this document, so it lives apart from the signing code (no import circle).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from certify.errors import VerificationError


@dataclass(frozen=True)
class Signature:
    """A detached signature over a statement, and the fingerprint of the key that made it."""

    algorithm: str
    value: str  # base64 DER
    key_fingerprint: str
    signed: dict[str, str]

    def to_json(self) -> str:
        """The ``results.json.sig`` document."""
        return json.dumps({"algorithm": self.algorithm, "signature": self.value,
                           "key_fingerprint": self.key_fingerprint, "signed": self.signed},
                          indent=2, sort_keys=True) + "\n"

    @staticmethod
    def from_json(text: str, where: str) -> Signature:
        """Parse a signature document, or raise VerificationError naming ``where``."""
        try:
            d = json.loads(text)
            signed = d["signed"]
            if not isinstance(signed, dict) or not all(
                    isinstance(v, str) for v in signed.values()):
                raise TypeError("signed")
            return Signature(str(d["algorithm"]), str(d["signature"]),
                             str(d["key_fingerprint"]), dict(signed))
        except (ValueError, KeyError, TypeError, RecursionError):
            raise VerificationError(f"{where}: the signature is malformed or from an older "
                                    "certify", hint="re-sign with `certify sign`") from None
