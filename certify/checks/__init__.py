"""Checks, one module per family, registered here by their suite ``kind``."""

from __future__ import annotations

from typing import Any

from certify.checks.attack import AttackCheck
from certify.checks.base import Check, CheckContext, Measurement
from certify.checks.brittleness import Brittleness
from certify.checks.clean import CleanAccuracy
from certify.checks.confidence import Coverage
from certify.checks.corruption import Corruption, CorruptionPair
from certify.checks.sanity import Sanity

CHECKS: dict[str, type[Check[Any]]] = {
    c.kind: c
    for c in (Sanity, CleanAccuracy, Coverage, Corruption, CorruptionPair, AttackCheck,
              Brittleness)
}

__all__ = ["CHECKS", "AttackCheck", "Brittleness", "Check", "CheckContext", "CleanAccuracy",
           "Corruption", "CorruptionPair", "Coverage", "Measurement", "Sanity"]
