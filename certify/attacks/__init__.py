"""Query-based black-box attacks behind one interface (see :mod:`certify.attacks.base`).

An attack's facts and constructor are read when a suite is validated, so importing an attack
imports no torch or kornia: its computing functions import them (issue 53)."""

from __future__ import annotations

from certify.attacks.apgd import APGD, APGDTargeted
from certify.attacks.base import Attack, AttackOutcome, AttackResult, margin, project
from certify.attacks.hsj import HopSkipJump
from certify.attacks.simple import RandomSearch, SpatialGrid
from certify.attacks.sparse_rs import SparseRS
from certify.attacks.square import SquareL2, SquareLinf

ATTACKS: dict[str, type[Attack]] = {
    a.name: a for a in (SquareLinf, SquareL2, HopSkipJump, RandomSearch, SpatialGrid,
                        SparseRS, APGD, APGDTargeted)
}

__all__ = ["APGD", "ATTACKS", "APGDTargeted", "Attack", "AttackOutcome", "AttackResult",
           "HopSkipJump", "RandomSearch", "SparseRS", "SpatialGrid", "SquareL2", "SquareLinf",
           "margin", "project"]
