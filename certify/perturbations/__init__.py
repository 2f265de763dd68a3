"""Pure, batched, seeded image perturbations (the corruption properties).

A suite reads :data:`PROPERTIES` (names, units, default bounds) when it is validated, so
importing them imports no torch or kornia: the transforms import them (issue 53)."""

from __future__ import annotations

from certify.perturbations.base import Property, mix_seed
from certify.perturbations.properties import PROPERTIES

__all__ = ["PROPERTIES", "Property", "mix_seed"]
