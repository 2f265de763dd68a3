"""certify's version (one place: the package, the wheel's metadata and the card read it)."""

__version__ = "0.1.0"
