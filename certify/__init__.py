"""certify: robustness evaluation of image classifiers, with a signed model card.

The Python API is :func:`certify.evaluate` (see :mod:`certify.api`); ``import certify`` stays
light (torch and onnxruntime load on first use).
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "evaluate"]


def __getattr__(name: str) -> Any:
    if name == "evaluate":
        from certify.api import evaluate

        return evaluate
    raise AttributeError(f"module 'certify' has no attribute {name!r}")
