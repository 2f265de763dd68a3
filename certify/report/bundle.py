"""An OpenSSF model-signing bundle over the model file and its card, as one signed unit.

The bundle is a folder holding the model (with its external-data files), card.html, card.pdf,
results.json and results.json.sig; the ``model-signing`` package (private-key mode, the same
ECDSA P-256 key as the card) signs the folder's manifest into a Sigstore-format bundle file
beside it. It is an optional extra, ``certify[bundle]``: ``pip install ".[bundle]"`` in a
certify checkout (or ``pip install model-signing pyopenssl``).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from certify.errors import UsageError, VerificationError
from certify.onnx_files import external_data_files, model_identity
from certify.results import RunResult

CARD_FILES = ("card.html", "card.pdf", "results.json", "results.json.sig")


def _model_signing():  # noqa: ANN202 - the optional module
    try:
        from model_signing import signing, verifying
    except ImportError:
        raise UsageError("model-signing bundles need the optional extra",
                         hint='the extra certify[bundle]: pip install ".[bundle]" in a '
                              'certify checkout, or pip install model-signing pyopenssl') \
            from None
    return signing, verifying


def _verified_results(run_dir: Path, key: Path, passphrase: str | None) -> RunResult:
    """The run's results, once its card, PDF and results.json verify with ``key``'s public key."""
    from certify.report.sign import load_private_key, verify_file

    public = load_private_key(key, None if passphrase is None else passphrase.encode()) \
        .public_key()
    results = None
    for name in ("card.html", "card.pdf", "results.json"):
        try:
            results = verify_file(run_dir / name, public).result
        except VerificationError as exc:
            raise VerificationError(f"refusing to bundle {run_dir}: {name} does not verify "
                                    f"with this key ({exc.message})",
                                    hint="bundle a card signed with this key (certify sign "
                                         f"{run_dir} --key {key})") from None
    if results is None:  # an older results format: its figures are not re-read here
        raise VerificationError(f"refusing to bundle {run_dir}: its results are in an older "
                                "format, which this certify verifies but does not read",
                                hint="rerun the suite with this certify and sign that run")
    return results


def make_bundle(run_dir: Path, model: Path, key: Path, out: Path,
                passphrase: str | None = None) -> Path:
    """Copy the model and the signed card into ``out`` and sign it; returns the bundle path.

    Refused before anything is written: a card that does not verify with ``key``'s public key,
    and a model (external-data files included) whose identity differs from the card's.
    """
    signing, _ = _model_signing()
    missing = [n for n in CARD_FILES if not (run_dir / n).is_file()]
    if missing:
        raise UsageError(f"{run_dir} lacks {', '.join(missing)}",
                         hint="sign the run first (certify sign), with the PDF")
    if not model.is_file():
        raise UsageError(f"model file not found: {model}", hint="pass the certified model")
    if out.exists():
        raise UsageError(f"{out} already exists", hint="choose another --out")
    results = _verified_results(run_dir, key, passphrase)
    certified = results.measurement.model.identity
    identity = model_identity(model)
    if identity != certified:
        raise UsageError(
            f"{model.name} is not the certified model: its identity {identity} differs from "
            f"the card's {certified}",
            hint="pass the model file the card was made for (with its external-data files)",
        )
    extra = external_data_files(model)
    clash = sorted({n for n in extra} & {*CARD_FILES, model.name})
    if clash:
        raise UsageError(f"{model.name}'s external data {', '.join(clash)} would overwrite a "
                         "bundle file", hint="save the weights under another name")
    out.mkdir(parents=True)
    shutil.copy2(model, out / model.name)
    for loc in extra:
        (out / loc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(model.parent / loc, out / loc)
    for name in CARD_FILES:
        shutil.copy2(run_dir / name, out / name)
    signature = out.with_name(out.name + ".sigstore.json")
    try:
        # model-signing is typed `str` but hands the password to cryptography, which needs bytes
        password: Any = None if passphrase is None else passphrase.encode()
        signing.Config().use_elliptic_key_signer(private_key=key, password=password).sign(
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
