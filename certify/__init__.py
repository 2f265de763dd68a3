"""certify: robustness evaluation of image classifiers, with a signed model card.

The package is the Python API's front door: :func:`certify.evaluate` (see :mod:`certify.api`)
and ``__version__``. ``import certify`` stays light: torch and onnxruntime load when
``evaluate`` is first used. certify's own modules import :mod:`certify.version`, never the
package, so the front door sits above everything it offers.
"""

from typing import Any

from certify.version import __version__

__all__ = ["__version__", "evaluate"]


def __getattr__(name: str) -> Any:
    if name == "evaluate":
        from certify.api import evaluate

        return evaluate
    raise AttributeError(f"module 'certify' has no attribute {name!r}")
