"""An OpenSSF model-signing bundle over the model file and its card, as one signed unit.

The bundle is a folder holding the model, card.html, card.pdf, results.json and
results.json.sig; the ``model-signing`` package (private-key mode, the same ECDSA P-256 key as
the card) signs the folder's manifest into a Sigstore-format bundle file beside it. It is an
optional extra: ``pip install "certify[bundle]"``.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from certify.errors import UsageError
from certify.report.sign import VerificationError

CARD_FILES = ("card.html", "card.pdf", "results.json", "results.json.sig")


def _model_signing():  # noqa: ANN202 - the optional module
    try:
        from model_signing import signing, verifying
    except ImportError:
        raise UsageError("model-signing bundles need the optional extra",
                         hint='pip install "certify[bundle]"') from None
    return signing, verifying


def make_bundle(run_dir: Path, model: Path, key: Path, out: Path,
                passphrase: str | None = None) -> Path:
    """Copy the model and the signed card into ``out`` and sign it; returns the bundle path."""
    signing, _ = _model_signing()
    missing = [n for n in CARD_FILES if not (run_dir / n).is_file()]
    if missing:
        raise UsageError(f"{run_dir} lacks {', '.join(missing)}",
                         hint="sign the run first (certify sign), with the PDF")
    if not model.is_file():
        raise UsageError(f"model file not found: {model}", hint="pass the certified model")
    if out.exists():
        raise UsageError(f"{out} already exists", hint="choose another --out")
    out.mkdir(parents=True)
    shutil.copy2(model, out / model.name)
    for name in CARD_FILES:
        shutil.copy2(run_dir / name, out / name)
    signature = out.with_name(out.name + ".sigstore.json")
    try:
        signing.Config().use_elliptic_key_signer(private_key=key, password=passphrase).sign(
            out, signature)
    except (ValueError, TypeError) as exc:
        shutil.rmtree(out)
        raise UsageError(f"cannot sign with {key}: {exc}", hint="use a key from keygen") \
            from None
    return signature


def verify_bundle(bundle: Path, signature: Path, public_key: Path) -> None:
    """Raise VerificationError unless the folder matches the bundle signed by the key."""
    _, verifying = _model_signing()
    if not bundle.is_dir() or not signature.is_file():
        raise UsageError(f"{bundle} or {signature} not found", hint="check the paths")
    try:
        verifying.Config().use_elliptic_key_verifier(public_key=public_key).verify(
            bundle, signature)
    except ValueError as exc:
        changed = re.findall(r"[Hh]ash mismatch for \\?'([^'\\]+)", str(exc))
        what = f"changed: {', '.join(changed)}" if changed else str(exc).splitlines()[0][:200]
        raise VerificationError(f"bundle verification failed ({what})",
                                hint="a file was changed, added or removed, or the key differs"
                                ) from None
