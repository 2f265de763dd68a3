"""Images that a card shows, kept out of the signed payload.

A check that wants to show an image (a failure example, a LIME heatmap) turns it into an 8-bit
RGB array and records only its digest in its details; the array travels beside the results
(``SuiteOutcome.images``), is written to the run directory as ``images/<hex>.png`` and embedded
by the card. The digest is taken over the pixels, not over an encoding, so a verifier can decode
whatever PNG a card embeds and check that it shows exactly the signed pixels.
"""

from __future__ import annotations

import base64
import hashlib
import io
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where a tensor is converted: a verifier needs none
    import torch

DATA_URI_PREFIX = "data:image/png;base64,"


def to_uint8(img: torch.Tensor | np.ndarray) -> np.ndarray:
    """A ``[C, H, W]`` float image in [0, 1] (tensor) or an ``[H, W, 3]`` float array in [0, 1]
    as a contiguous ``[H, W, 3]`` uint8 array (grayscale is repeated to three channels)."""
    if not isinstance(img, np.ndarray):  # a torch tensor (numpy arrays need no torch)
        arr = img.detach().cpu().float().clamp(0, 1).permute(1, 2, 0).numpy()
    else:
        arr = np.clip(np.asarray(img, dtype=np.float64), 0, 1)
    out = np.rint(arr * 255).astype(np.uint8)
    if out.ndim == 2:
        out = out[..., None]
    if out.shape[2] == 1:
        out = np.repeat(out, 3, axis=2)
    return np.ascontiguousarray(out[..., :3])


def image_digest(arr: np.ndarray) -> str:
    """``sha256:<hex>`` of an ``[H, W, 3]`` uint8 array's shape and pixels."""
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"expected [H, W, 3] uint8 pixels, got {arr.dtype} {arr.shape}")
    h = hashlib.sha256(f"{arr.shape[0]}x{arr.shape[1]}x3:".encode())
    h.update(np.ascontiguousarray(arr).tobytes())
    return "sha256:" + h.hexdigest()


class ImageSink:
    """Collects the images of one check summary: ``add`` returns the digest to record."""

    def __init__(self) -> None:
        self.images: dict[str, np.ndarray] = {}

    def add(self, img: torch.Tensor | np.ndarray) -> str:
        """Keep ``img`` (see :func:`to_uint8`) and return its digest."""
        return self.add_pixels(to_uint8(img))

    def add_pixels(self, arr: np.ndarray) -> str:
        """Keep ``[H, W, 3]`` uint8 pixels as they are and return their digest."""
        digest = image_digest(arr)
        self.images[digest] = np.ascontiguousarray(arr)
        return digest


def png_bytes(arr: np.ndarray) -> bytes:
    """Lossless PNG encoding of ``[H, W, 3]`` uint8 pixels (deterministic for one Pillow)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr, mode="RGB").save(buf, format="PNG", optimize=True)
    return buf.getvalue()


#: The most pixels a card image may have when it is decoded (a card's images are sample
#: thumbnails of a few hundred pixels a side). Pillow's own limit (89 M pixels, 265 MB as RGB,
#: copied once more by the conversion) let a genuine card with one huge image added to its
#: visible part cost the verifier over 1 GB before it compared anything.
MAX_IMAGE_PIXELS = 4096 * 4096


def decode_png(data: bytes) -> np.ndarray:
    """The ``[H, W, 3]`` uint8 pixels of an encoded image (raises ValueError if unreadable, or
    larger than :data:`MAX_IMAGE_PIXELS`: the size is read from the header before decoding)."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            # Pillow warns between its limit and twice it, and raises beyond: the size is
            # checked against this module's smaller limit here instead
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
        with im:
            width, height = im.size
            if width * height > MAX_IMAGE_PIXELS:
                raise ValueError(f"an image of {width}×{height} pixels is larger than a card "
                                 f"image may be ({MAX_IMAGE_PIXELS:,} pixels)")
            return np.ascontiguousarray(np.asarray(im.convert("RGB")))
    except Image.DecompressionBombError:
        raise ValueError(f"an image is larger than a card image may be ({MAX_IMAGE_PIXELS:,} "
                         "pixels)") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"not a readable image: {exc}") from None


def data_uri(png: bytes) -> str:
    """A base64 PNG data URI."""
    return DATA_URI_PREFIX + base64.b64encode(png).decode("ascii")


def pixels_of_data_uri(uri: str) -> np.ndarray:
    """Decode a base64 PNG data URI back to pixels (ValueError if it is not one)."""
    if not uri.startswith(DATA_URI_PREFIX):
        raise ValueError("not a base64 PNG data URI")
    try:
        raw = base64.b64decode(uri[len(DATA_URI_PREFIX):], validate=True)
    except ValueError:
        raise ValueError("corrupt base64 in an image") from None
    return decode_png(raw)
