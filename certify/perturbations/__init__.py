"""Pure, batched, seeded image perturbations (the corruption properties)."""

from __future__ import annotations

from certify.perturbations.base import Property, mix_seed
from certify.perturbations.properties import PROPERTIES

__all__ = ["PROPERTIES", "Property", "mix_seed"]
