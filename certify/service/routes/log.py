"""The transparency log's public routes (no token: auditors use them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, TypeVar

from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.responses import PlainTextResponse

from certify.service.merkle import LogError
from certify.service.tlog import TransparencyLog

#: Log indices and sizes: what a database integer holds (a larger number is refused with 422).
Index = Annotated[int, Path(ge=0, le=2**63 - 1)]
Size = Annotated[int, Query(ge=0, le=2**63 - 1)]
_Doc = TypeVar("_Doc")


def _guard(fn: Callable[[], _Doc], status: int = 404) -> _Doc:
    """``fn()``, its :class:`LogError` answered with ``status``."""
    try:
        return fn()
    except LogError as exc:
        raise HTTPException(status, exc.message) from None


def log_router(get_log: Callable[[], TransparencyLog], public_pem: bytes,
               certificate_pem: bytes | None = None) -> APIRouter:
    """``/log``, ``/log/entries/{n}``, ``/log/proof/*``, ``/log/lookup``, ``/key`` and
    ``/certificate``."""
    r = APIRouter(tags=["transparency log"])

    @r.get("/log")
    def tree_head() -> Mapping[str, object]:
        """The latest signed tree head."""
        return get_log().tree_head()

    @r.get("/log/entries/{n}")
    def entry(n: Index) -> Mapping[str, object]:
        """One entry: its leaf hash and the statement it logs."""
        return _guard(lambda: get_log().entry(n))

    @r.get("/log/proof/inclusion")
    def inclusion(index: Size, tree_size: Size) -> Mapping[str, object]:
        """The audit path of an entry in a tree of the given size."""
        return _guard(lambda: get_log().inclusion(index, tree_size), 400)

    @r.get("/log/proof/consistency")
    def consistency(first: Size, second: Size) -> Mapping[str, object]:
        """Proof that the tree of size ``first`` is a prefix of the tree of size ``second``."""
        return _guard(lambda: get_log().consistency(first, second), 400)

    @r.get("/log/lookup")
    def lookup(statement_digest: str) -> Mapping[str, object]:
        """The index of the entry logging a statement digest."""
        idx = get_log().lookup(statement_digest)
        if idx is None:
            raise HTTPException(404, f"no entry for {statement_digest[:80]}")
        return {"index": idx}

    @r.get("/key", response_class=PlainTextResponse)
    def key() -> PlainTextResponse:
        """The service's public key (PEM): it signs cards and tree heads."""
        return PlainTextResponse(public_pem.decode("ascii"))

    @r.get("/certificate", response_class=PlainTextResponse)
    def certificate() -> PlainTextResponse:
        """The signing key's self-issued certificate (PEM), which every card.pdf's PDF
        signature names: import it as a trusted root to have PDF readers trust the cards."""
        if certificate_pem is None:
            raise HTTPException(404, "this service publishes no certificate")
        return PlainTextResponse(certificate_pem.decode("ascii"))

    return r
