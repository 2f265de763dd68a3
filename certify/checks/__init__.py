"""Checks, one module per family, registered here by their suite ``kind``."""

from __future__ import annotations

from certify.checks.base import Check, CheckContext, Measurement
from certify.checks.clean import CleanAccuracy

CHECKS: dict[str, type[Check]] = {c.kind: c for c in (CleanAccuracy,)}

__all__ = ["CHECKS", "Check", "CheckContext", "CleanAccuracy", "Measurement"]
