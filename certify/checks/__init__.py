"""Checks, one module per family, registered here by their suite ``kind``.

Importing them imports no torch: a suite constructs and validates its checks (``certify suites
list``, ``init``) without it, and each check imports torch inside the methods that compute
(issue 53; ``tests/test_layout.py`` holds every such method to importing what it uses)."""

from __future__ import annotations

from typing import Any

from certify.checks.attack import AttackCheck, attack_of
from certify.checks.base import Check, CheckContext, Measurement, Role
from certify.checks.brittleness import Brittleness
from certify.checks.certified import Certified, certified_of
from certify.checks.clean import CleanAccuracy
from certify.checks.confidence import Coverage
from certify.checks.corruption import Corruption, CorruptionPair
from certify.checks.sanity import Sanity

CHECKS: dict[str, type[Check[Any]]] = {
    c.kind: c
    for c in (Sanity, CleanAccuracy, Coverage, Corruption, CorruptionPair, AttackCheck,
              Certified, Brittleness)
}

__all__ = ["CHECKS", "AttackCheck", "Brittleness", "Certified", "Check", "CheckContext",
           "CleanAccuracy", "Corruption", "CorruptionPair", "Coverage", "Measurement", "Role",
           "Sanity", "attack_of", "certified_of"]
