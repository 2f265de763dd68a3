"""Procedural GTSRB-like traffic-sign images for all 43 GTSRB classes.

The generator draws each sign from vector primitives (no font files, no downloads) with numpy
and Pillow only, then places it on a cluttered background with random lighting, scale, rotation,
mild perspective, blur, noise and occasional partial occlusion. Images are never flipped, so
mirrored class pairs (keep left / keep right, turn left / turn right, ...) stay distinct.

Every image is a pure function of ``(seed, class_id, index)``: :func:`generate` seeds a fresh
``numpy.random.Generator`` from ``np.random.SeedSequence([seed, class_id, index])`` for each
image, so any subset can be regenerated independently and byte-identically.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from functools import cache, lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

__all__ = ["GTSRB_CLASS_NAMES", "NUM_CLASSES", "contact_sheet", "generate", "render_sign"]

GTSRB_CLASS_NAMES: tuple[str, ...] = (
    "Speed limit (20km/h)",
    "Speed limit (30km/h)",
    "Speed limit (50km/h)",
    "Speed limit (60km/h)",
    "Speed limit (70km/h)",
    "Speed limit (80km/h)",
    "End of speed limit (80km/h)",
    "Speed limit (100km/h)",
    "Speed limit (120km/h)",
    "No passing",
    "No passing for vehicles over 3.5 metric tons",
    "Right-of-way at the next intersection",
    "Priority road",
    "Yield",
    "Stop",
    "No vehicles",
    "Vehicles over 3.5 metric tons prohibited",
    "No entry",
    "General caution",
    "Dangerous curve to the left",
    "Dangerous curve to the right",
    "Double curve",
    "Bumpy road",
    "Slippery road",
    "Road narrows on the right",
    "Road work",
    "Traffic signals",
    "Pedestrians",
    "Children crossing",
    "Bicycles crossing",
    "Beware of ice/snow",
    "Wild animals crossing",
    "End of all speed and passing limits",
    "Turn right ahead",
    "Turn left ahead",
    "Ahead only",
    "Go straight or right",
    "Go straight or left",
    "Keep right",
    "Keep left",
    "Roundabout mandatory",
    "End of no passing",
    "End of no passing by vehicles over 3.5 metric tons",
)

NUM_CLASSES: int = len(GTSRB_CLASS_NAMES)

_SHORT_NAMES: tuple[str, ...] = (
    "20 km/h",
    "30 km/h",
    "50 km/h",
    "60 km/h",
    "70 km/h",
    "80 km/h",
    "end 80",
    "100 km/h",
    "120 km/h",
    "no passing",
    "no pass >3.5t",
    "right-of-way",
    "priority road",
    "yield",
    "stop",
    "no vehicles",
    ">3.5t prohib.",
    "no entry",
    "caution",
    "curve left",
    "curve right",
    "double curve",
    "bumpy road",
    "slippery",
    "narrows right",
    "road work",
    "signals",
    "pedestrians",
    "children",
    "bicycles",
    "ice/snow",
    "wild animals",
    "end limits",
    "turn right",
    "turn left",
    "ahead only",
    "straight/right",
    "straight/left",
    "keep right",
    "keep left",
    "roundabout",
    "end no pass",
    "end no pass >3.5t",
)

# Canonical sign colours (RGB). Per-image fading and colour casts are applied later.
_RED = (196, 26, 36)
_WHITE = (244, 244, 238)
_BLACK = (22, 22, 24)
_BLUE = (20, 74, 170)
_YELLOW = (250, 194, 12)
_END_GREY = (135, 135, 135)  # pictograms on "end of ..." signs
_BAR_GREY = (70, 70, 70)  # diagonal bars on "end of ..." signs
_RIM_GREY = (110, 110, 110)  # thin outline of "end of ..." signs
_LIGHT_RED = (215, 30, 30)
_LIGHT_YELLOW = (250, 185, 0)
_LIGHT_GREEN = (30, 165, 70)

_SUPERSAMPLE = 4  # canonical signs are drawn at this multiple of the working resolution
_SIGN_EXTENT = 0.96  # half-extent of every sign in normalised canonical coordinates

Colour = tuple[int, int, int]
Pt = tuple[float, float]


# --------------------------------------------------------------------------------------------
# Vector drawing helpers
# --------------------------------------------------------------------------------------------


class _Frame:
    """A local coordinate frame for drawing.

    The root frame maps normalised sign coordinates ``[-1, 1]^2`` (x right, y down) onto the
    whole canvas. Sub-frames add a translation, uniform scale, rotation (degrees, clockwise on
    screen) and an optional mirror of the local x axis. Mirroring is only used to author the
    canonical drawing of mirrored classes; rendered images are never flipped.
    """

    def __init__(
        self,
        draw: ImageDraw.ImageDraw,
        half: float,
        parent: _Frame | None = None,
        offset: Pt = (0.0, 0.0),
        scale: float = 1.0,
        angle: float = 0.0,
        mirror: bool = False,
    ) -> None:
        self._draw = draw
        self._half = half
        self._parent = parent
        self._ox, self._oy = offset
        self._s = scale
        rad = math.radians(angle)
        self._cos = math.cos(rad)
        self._sin = math.sin(rad)
        self._mirror = mirror
        self._px_scale: float = scale * (parent._px_scale if parent is not None else half)

    def sub(
        self, cx: float, cy: float, scale: float, angle: float = 0.0, mirror: bool = False
    ) -> _Frame:
        """Return a child frame centred at ``(cx, cy)`` of this frame."""
        return _Frame(self._draw, self._half, self, (cx, cy), scale, angle, mirror)

    def to_px(self, x: float, y: float) -> Pt:
        """Map a local point to canvas pixel coordinates."""
        frame: _Frame | None = self
        while frame is not None:
            if frame._mirror:
                x = -x
            xr = frame._cos * x - frame._sin * y
            yr = frame._sin * x + frame._cos * y
            x = frame._ox + frame._s * xr
            y = frame._oy + frame._s * yr
            if frame._parent is None:
                return ((x + 1.0) * frame._half, (y + 1.0) * frame._half)
            frame = frame._parent
        raise AssertionError("unreachable")

    def width_px(self, width: float) -> int:
        """Convert a local stroke width to whole pixels."""
        return max(1, int(round(width * self._px_scale)))

    def poly(self, pts: Sequence[Pt], fill: Colour) -> None:
        """Fill a polygon."""
        self._draw.polygon([self.to_px(x, y) for x, y in pts], fill=fill)

    def rect(self, x0: float, y0: float, x1: float, y1: float, fill: Colour) -> None:
        """Fill an axis-aligned (in local coordinates) rectangle."""
        self.poly([(x0, y0), (x1, y0), (x1, y1), (x0, y1)], fill)

    def circle(self, cx: float, cy: float, r: float, fill: Colour) -> None:
        """Fill a circle."""
        px, py = self.to_px(cx, cy)
        rp = r * self._px_scale
        self._draw.ellipse([px - rp, py - rp, px + rp, py + rp], fill=fill)

    def ring(self, cx: float, cy: float, r: float, width: float, fill: Colour) -> None:
        """Stroke a circle of centre-line radius ``r``."""
        px, py = self.to_px(cx, cy)
        ro = (r + width / 2.0) * self._px_scale
        self._draw.ellipse(
            [px - ro, py - ro, px + ro, py + ro], outline=fill, width=self.width_px(width)
        )

    def ellipse(
        self, cx: float, cy: float, rx: float, ry: float, fill: Colour, angle: float = 0.0
    ) -> None:
        """Fill an ellipse rotated by ``angle`` degrees."""
        ca, sa = math.cos(math.radians(angle)), math.sin(math.radians(angle))
        pts = []
        for k in range(40):
            t = 2.0 * math.pi * k / 40
            ex, ey = rx * math.cos(t), ry * math.sin(t)
            pts.append((cx + ca * ex - sa * ey, cy + sa * ex + ca * ey))
        self.poly(pts, fill)

    def line(self, pts: Sequence[Pt], width: float, fill: Colour, caps: bool = True) -> None:
        """Stroke a polyline with round joints (and round end caps unless ``caps`` is False)."""
        self._draw.line(
            [self.to_px(x, y) for x, y in pts],
            fill=fill,
            width=self.width_px(width),
            joint="curve",
        )
        if caps:
            for x, y in (pts[0], pts[-1]):
                self.circle(x, y, width / 2.0, fill)


def _arc(cx: float, cy: float, rx: float, ry: float, a0: float, a1: float, n: int = 0) -> list[Pt]:
    """Points on an elliptical arc from ``a0`` to ``a1`` degrees (0 = +x, 90 = +y / down)."""
    if n <= 0:
        n = max(4, int(abs(a1 - a0) / 6.0))
    out = []
    for k in range(n + 1):
        a = math.radians(a0 + (a1 - a0) * k / n)
        out.append((cx + rx * math.cos(a), cy + ry * math.sin(a)))
    return out


def _arrow(
    f: _Frame, pts: Sequence[Pt], width: float, head_w: float, head_l: float, fill: Colour
) -> None:
    """Draw an arrow along a polyline with a flat tail and a triangular head at the end."""
    p = np.asarray(pts, dtype=np.float64)
    seg = np.diff(p, axis=0)
    lens = np.hypot(seg[:, 0], seg[:, 1])
    cum = np.concatenate([[0.0], np.cumsum(lens)])
    target = max(cum[-1] - head_l, 1e-6)
    idx = int(np.clip(np.searchsorted(cum, target) - 1, 0, len(seg) - 1))
    t = (target - cum[idx]) / max(lens[idx], 1e-9)
    base = p[idx] + t * seg[idx]
    tip = p[-1]
    d = tip - base
    d = d / max(float(np.hypot(d[0], d[1])), 1e-9)
    nrm = np.array([-d[1], d[0]])
    shaft = [tuple(q) for q in p[: idx + 1]] + [tuple(base + d * width * 0.1)]
    f.line(shaft, width, fill, caps=False)
    hw = head_w / 2.0
    f.poly([tuple(tip), tuple(base + nrm * hw), tuple(base - nrm * hw)], fill)


def _inset(verts: Sequence[Pt], centre: Pt, inradius: float, d: float) -> list[Pt]:
    """Shrink a regular polygon about its centre so that its inradius drops by ``d``."""
    k = (inradius - d) / inradius
    cx, cy = centre
    return [(cx + (x - cx) * k, cy + (y - cy) * k) for x, y in verts]


def _rounded_regular(
    f: _Frame, verts: Sequence[Pt], centre: Pt, inradius: float, corner: float, fill: Colour
) -> None:
    """Fill a regular polygon (given by its sharp vertices) with rounded corners."""
    inner = _inset(verts, centre, inradius, corner)
    f.poly(inner, fill)
    f.line([*inner, inner[0], inner[1]], 2.0 * corner, fill, caps=False)
    for x, y in inner:
        f.circle(x, y, corner, fill)


# --------------------------------------------------------------------------------------------
# Stroke font (digits and the letters of STOP)
# --------------------------------------------------------------------------------------------


def _glyph(ch: str) -> list[list[Pt]]:
    """Centre-line polylines of a glyph in a unit box (x right, y down)."""
    if ch == "0":
        return [_arc(0.5, 0.5, 0.35, 0.425, 0, 360, 48)]
    if ch == "1":
        return [[(0.22, 0.27), (0.62, 0.075), (0.62, 0.925)]]
    if ch == "2":
        return [_arc(0.5, 0.3, 0.35, 0.225, 195, 370) + [(0.15, 0.925), (0.88, 0.925)]]
    if ch == "3":
        return [_arc(0.5, 0.29, 0.33, 0.215, 205, 450) + _arc(0.5, 0.71, 0.36, 0.215, 270, 515)]
    if ch == "5":
        return [
            [(0.84, 0.075), (0.22, 0.075), (0.17, 0.47)] + _arc(0.5, 0.66, 0.36, 0.265, 235, 500)
        ]
    if ch == "6":
        return [_arc(0.62, 0.66, 0.48, 0.585, 292, 180), _arc(0.5, 0.66, 0.35, 0.265, 0, 360)]
    if ch == "7":
        return [[(0.13, 0.075), (0.87, 0.075), (0.36, 0.925)]]
    if ch == "8":
        return [_arc(0.5, 0.285, 0.3, 0.21, 0, 360), _arc(0.5, 0.705, 0.36, 0.22, 0, 360)]
    if ch == "S":
        return [_arc(0.5, 0.29, 0.35, 0.215, 335, 90) + _arc(0.5, 0.71, 0.36, 0.215, 270, 515)]
    if ch == "T":
        return [[(0.08, 0.075), (0.92, 0.075)], [(0.5, 0.075), (0.5, 0.925)]]
    if ch == "O":
        return [_arc(0.5, 0.5, 0.36, 0.425, 0, 360, 48)]
    if ch == "P":
        return [
            [(0.17, 0.925), (0.17, 0.075), (0.52, 0.075)]
            + _arc(0.52, 0.29, 0.32, 0.215, 270, 450)
            + [(0.17, 0.505)]
        ]
    raise ValueError(f"no glyph for {ch!r}")


def _text(
    f: _Frame,
    text: str,
    cx: float,
    cy: float,
    height: float,
    char_w: float,
    gap: float,
    stroke: float,
    fill: Colour,
) -> None:
    """Draw ``text`` with the stroke font, centred at ``(cx, cy)``."""
    total = len(text) * char_w + (len(text) - 1) * gap
    x0 = cx - total / 2.0
    y0 = cy - height / 2.0
    for i, ch in enumerate(text):
        left = x0 + i * (char_w + gap)
        for line in _glyph(ch):
            f.line([(left + u * char_w, y0 + v * height) for u, v in line], stroke, fill)


# --------------------------------------------------------------------------------------------
# Sign bodies
# --------------------------------------------------------------------------------------------

_TRI_H = 1.96 * math.sqrt(3.0) / 2.0  # height of the warning triangle
_TRI_UP = [(0.0, -_TRI_H / 2.0), (0.98, _TRI_H / 2.0), (-0.98, _TRI_H / 2.0)]
_TRI_UP_C = (0.0, -_TRI_H / 2.0 + 2.0 * _TRI_H / 3.0)
_TRI_DOWN = [(-0.98, -_TRI_H / 2.0), (0.98, -_TRI_H / 2.0), (0.0, _TRI_H / 2.0)]
_TRI_DOWN_C = (0.0, _TRI_H / 2.0 - 2.0 * _TRI_H / 3.0)
_TRI_R = _TRI_H / 3.0  # inradius


def _prohibitory(f: _Frame) -> None:
    f.circle(0, 0, 0.96, _WHITE)
    f.circle(0, 0, 0.925, _RED)
    f.circle(0, 0, 0.72, _WHITE)


def _end_disc(f: _Frame) -> None:
    f.circle(0, 0, 0.96, _RIM_GREY)
    f.circle(0, 0, 0.93, _WHITE)


def _end_bars(f: _Frame, n: int = 5, band: float = 0.46, r: float = 0.9) -> None:
    """Thin parallel diagonal bars from upper right to lower left across the disc."""
    s2 = math.sqrt(0.5)
    d = (s2, -s2)
    nrm = (s2, s2)
    lw = band / (n - 1) * 0.5
    for k in range(n):
        o = -band / 2.0 + k * band / (n - 1)
        half = math.sqrt(max(r * r - o * o, 0.0))
        cx, cy = nrm[0] * o, nrm[1] * o
        f.line(
            [(cx - d[0] * half, cy - d[1] * half), (cx + d[0] * half, cy + d[1] * half)],
            lw,
            _BAR_GREY,
            caps=False,
        )


def _mandatory(f: _Frame) -> None:
    f.circle(0, 0, 0.96, _WHITE)
    f.circle(0, 0, 0.925, _BLUE)


def _warning(f: _Frame) -> _Frame:
    """Draw a warning triangle and return the frame for its pictogram."""
    _rounded_regular(f, _TRI_UP, _TRI_UP_C, _TRI_R, 0.1, _WHITE)
    red = _inset(_TRI_UP, _TRI_UP_C, _TRI_R, 0.035)
    _rounded_regular(f, red, _TRI_UP_C, _TRI_R - 0.035, 0.08, _RED)
    inner = _inset(_TRI_UP, _TRI_UP_C, _TRI_R, 0.22)
    _rounded_regular(f, inner, _TRI_UP_C, _TRI_R - 0.22, 0.03, _WHITE)
    return f.sub(0.0, 0.25, 0.39)


def _speed(f: _Frame, digits: str, fill: Colour = _BLACK) -> None:
    if len(digits) == 2:
        _text(f, digits, 0.0, 0.0, 0.76, 0.4, 0.07, 0.115, fill)
    else:
        _text(f, digits, 0.0, 0.0, 0.62, 0.3, 0.05, 0.095, fill)


# --------------------------------------------------------------------------------------------
# Pictograms (drawn in a local [-1, 1] frame)
# --------------------------------------------------------------------------------------------


def _car_back(f: _Frame, fill: Colour, window: Colour = _WHITE) -> None:
    f.poly([(-0.72, -0.12), (-0.52, -0.78), (0.52, -0.78), (0.72, -0.12)], fill)
    f.poly(
        [(-0.92, -0.02), (-0.8, -0.16), (0.8, -0.16), (0.92, -0.02), (0.92, 0.56), (-0.92, 0.56)],
        fill,
    )
    f.poly([(-0.5, -0.22), (-0.37, -0.63), (0.37, -0.63), (0.5, -0.22)], window)
    f.rect(-0.86, 0.5, -0.5, 0.92, fill)
    f.rect(0.5, 0.5, 0.86, 0.92, fill)


def _truck_back(f: _Frame, fill: Colour) -> None:
    f.rect(-0.88, -0.98, 0.88, 0.58, fill)
    f.rect(-0.84, 0.5, -0.46, 0.96, fill)
    f.rect(0.46, 0.5, 0.84, 0.96, fill)


def _truck_side(f: _Frame, fill: Colour, window: Colour = _WHITE) -> None:
    f.rect(-0.22, -0.62, 0.97, 0.3, fill)
    f.poly([(-0.97, 0.3), (-0.97, -0.08), (-0.82, -0.36), (-0.3, -0.36), (-0.3, 0.3)], fill)
    f.poly([(-0.86, -0.1), (-0.76, -0.27), (-0.44, -0.27), (-0.44, -0.1)], window)
    f.rect(-0.97, 0.22, 0.97, 0.4, fill)
    for x in (-0.65, 0.42, 0.76):
        f.circle(x, 0.47, 0.18, fill)


def _two_vehicles(
    f: _Frame, left: Callable[[_Frame, Colour], None], left_fill: Colour, right_fill: Colour
) -> None:
    left(f.sub(-0.32, 0.0, 0.29), left_fill)
    _car_back(f.sub(0.33, 0.04, 0.29), right_fill)


def _cross(f: _Frame) -> None:
    f.poly([(-0.13, -1.0), (0.13, -1.0), (0.21, 1.0), (-0.21, 1.0)], _BLACK)
    f.rect(-0.78, -0.19, 0.78, 0.05, _BLACK)


def _exclamation(f: _Frame) -> None:
    f.poly([(-0.19, -0.98), (0.19, -0.98), (0.12, 0.38), (-0.12, 0.38)], _BLACK)
    f.circle(0.0, 0.74, 0.19, _BLACK)


def _curve(f: _Frame) -> None:
    """Dangerous curve to the left (mirror for the right-hand curve)."""
    end_angle = 288.0
    pts = [(0.32, 1.0), (0.32, 0.22)] + _arc(-0.48, 0.22, 0.8, 0.8, 360.0, end_angle)
    a = math.radians(end_angle)
    ex, ey = pts[-1]
    pts.append((ex + 0.5 * math.sin(a), ey - 0.5 * math.cos(a)))
    _arrow(f, pts, 0.26, 0.66, 0.5, _BLACK)


def _double_curve(f: _Frame) -> None:
    pts = []
    for k in range(41):
        t = k / 40.0
        pts.append((-0.42 * math.sin(2.0 * math.pi * t) + 0.05, 1.0 - 1.95 * t))
    _arrow(f, pts, 0.24, 0.62, 0.45, _BLACK)


def _bump_profile(x: float) -> float:
    y = 0.0
    for c in (-0.48, 0.48):
        t = (x - c) / 0.42
        if abs(t) < 1.0:
            y += math.cos(t * math.pi / 2.0) ** 2
    return y


def _bumpy(f: _Frame) -> None:
    xs = [-1.0 + 2.0 * k / 48 for k in range(49)]
    top = [(x, 0.55 - 0.75 * _bump_profile(x)) for x in xs]
    f.poly(top + [(1.0, 0.85), (-1.0, 0.85)], _BLACK)


def _slippery(f: _Frame) -> None:
    _car_back(f.sub(0.0, -0.5, 0.5, angle=-12.0), _BLACK)
    for side in (-1.0, 1.0):
        pts = []
        for k in range(25):
            t = k / 24.0
            pts.append((side * 0.3 + 0.25 * math.sin(2.0 * math.pi * t * 1.2), 0.05 + 0.9 * t))
        f.line(pts, 0.12, _BLACK)


def _narrows_right(f: _Frame) -> None:
    f.line([(-0.48, -1.0), (-0.48, 1.0)], 0.22, _BLACK, caps=False)
    f.line([(0.52, 1.0), (0.52, 0.3), (0.08, -0.2), (0.08, -1.0)], 0.22, _BLACK, caps=False)


def _road_work(f: _Frame) -> None:
    f.poly([(0.15, 0.95), (0.62, 0.35), (1.0, 0.95)], _BLACK)  # pile
    f.circle(-0.25, -0.78, 0.19, _BLACK)  # head
    f.line([(-0.32, -0.5), (-0.48, 0.15)], 0.3, _BLACK)  # torso, bent forward
    f.line([(-0.48, 0.12), (-0.7, 0.55), (-0.78, 0.95)], 0.17, _BLACK)  # legs
    f.line([(-0.45, 0.12), (-0.2, 0.55), (-0.18, 0.95)], 0.17, _BLACK)
    f.line([(-0.33, -0.42), (-0.05, -0.15), (0.15, -0.2)], 0.13, _BLACK)  # arms
    f.line([(-0.35, -0.35), (0.0, 0.05)], 0.13, _BLACK)
    f.line([(-0.05, -0.45), (0.45, 0.4)], 0.08, _BLACK)  # shovel handle
    f.poly([(0.35, 0.35), (0.55, 0.25), (0.65, 0.55), (0.45, 0.62)], _BLACK)  # blade


def _signals(f: _Frame) -> None:
    f.rect(-0.42, -1.0, 0.42, 1.0, _BLACK)
    for y, col in ((-0.62, _LIGHT_RED), (0.0, _LIGHT_YELLOW), (0.62, _LIGHT_GREEN)):
        f.circle(0.0, y, 0.27, col)


def _person(f: _Frame, run: float = 0.0) -> None:
    """Walking (run=0) or running (run=1) person facing left, head top at -1, feet at +1."""
    f.circle(0.05, -0.79, 0.2, _BLACK)
    f.line([(0.02, -0.5), (0.08, 0.12)], 0.3, _BLACK)
    a = 0.15 * run
    f.line([(0.05, -0.42), (0.32 + a, -0.1), (0.42 + a, 0.18 - a)], 0.13, _BLACK)
    f.line([(0.02, -0.42), (-0.25 - a, -0.15), (-0.4 - a, 0.12 - a)], 0.13, _BLACK)
    f.line([(0.08, 0.08), (0.28 + a, 0.55), (0.48 + a, 0.98)], 0.17, _BLACK)
    f.line([(0.05, 0.08), (-0.2 - a, 0.52), (-0.38 - 1.5 * a, 0.98 - 0.5 * a)], 0.17, _BLACK)


def _pedestrian(f: _Frame) -> None:
    _person(f.sub(0.0, 0.0, 0.98))


def _children(f: _Frame) -> None:
    _person(f.sub(-0.36, 0.98 - 0.7, 0.7), run=1.0)
    _person(f.sub(0.45, 0.98 - 0.52, 0.52), run=1.0)


def _bicycle(f: _Frame) -> None:
    for x in (-0.56, 0.56):
        f.ring(x, 0.42, 0.34, 0.11, _BLACK)
    w = 0.09
    f.line([(-0.56, 0.42), (-0.05, 0.42), (0.36, -0.12), (-0.2, -0.12), (-0.56, 0.42)], w, _BLACK)
    f.line([(-0.05, 0.42), (-0.26, -0.3)], w, _BLACK)
    f.line([(0.56, 0.42), (0.3, -0.4), (0.12, -0.46)], w, _BLACK)
    f.line([(-0.4, -0.33), (-0.13, -0.33)], 0.11, _BLACK)


def _snowflake(f: _Frame) -> None:
    f = f.sub(0.0, 0.05, 0.95)
    for k in range(3):
        a = math.radians(90.0 + 60.0 * k)
        c, s = math.cos(a), math.sin(a)
        f.line([(-0.92 * c, -0.92 * s), (0.92 * c, 0.92 * s)], 0.13, _BLACK)
    for k in range(6):
        a = math.radians(90.0 + 60.0 * k)
        c, s = math.cos(a), math.sin(a)
        px, py = 0.55 * c, 0.55 * s
        for da in (-45.0, 45.0):
            b = a + math.radians(da)
            f.line([(px, py), (px + 0.32 * math.cos(b), py + 0.32 * math.sin(b))], 0.1, _BLACK)


def _deer(f: _Frame) -> None:
    f.ellipse(0.12, 0.08, 0.52, 0.24, _BLACK, angle=18.0)  # body
    f.line([(-0.25, -0.02), (-0.5, -0.48)], 0.22, _BLACK)  # neck
    f.ellipse(-0.63, -0.52, 0.2, 0.1, _BLACK, angle=25.0)  # head
    f.line([(-0.5, -0.6), (-0.38, -0.95)], 0.07, _BLACK)  # antlers
    f.line([(-0.43, -0.8), (-0.58, -0.96)], 0.06, _BLACK)
    f.line([(-0.44, -0.58), (-0.18, -0.86)], 0.07, _BLACK)
    f.line([(-0.3, -0.74), (-0.28, -0.95)], 0.06, _BLACK)
    f.line([(-0.25, 0.08), (-0.58, 0.22), (-0.85, 0.08)], 0.1, _BLACK)  # front legs
    f.line([(-0.18, 0.14), (-0.48, 0.38), (-0.78, 0.36)], 0.1, _BLACK)
    f.line([(0.5, 0.18), (0.72, 0.52), (0.98, 0.78)], 0.11, _BLACK)  # hind legs
    f.line([(0.42, 0.25), (0.55, 0.6), (0.82, 0.92)], 0.11, _BLACK)
    f.ellipse(0.66, -0.02, 0.1, 0.06, _BLACK, angle=-30.0)  # tail


def _turn(f: _Frame) -> None:
    """Turn right ahead (mirror for left)."""
    pts = [(-0.32, 0.72), (-0.32, 0.02)] + _arc(0.06, 0.02, 0.38, 0.38, 180, 270)
    pts.append((0.7, -0.36))
    _arrow(f, pts, 0.24, 0.62, 0.36, _WHITE)


def _ahead(f: _Frame) -> None:
    _arrow(f, [(0.0, 0.76), (0.0, -0.76)], 0.25, 0.64, 0.38, _WHITE)


def _straight_or_right(f: _Frame) -> None:
    _arrow(f, [(-0.2, 0.78), (-0.2, -0.78)], 0.22, 0.56, 0.34, _WHITE)
    pts = [(-0.2, 0.45), (-0.2, 0.3)] + _arc(0.14, 0.3, 0.34, 0.34, 180, 270)
    pts.append((0.74, -0.04))
    _arrow(f, pts, 0.2, 0.54, 0.32, _WHITE)


def _keep_right(f: _Frame) -> None:
    _arrow(f, [(-0.48, -0.48), (0.52, 0.52)], 0.25, 0.66, 0.42, _WHITE)


def _roundabout(f: _Frame) -> None:
    for k in range(3):
        a0 = 60.0 + 120.0 * k
        _arrow(f, _arc(0.0, 0.0, 0.5, 0.5, a0, a0 - 88.0, 24), 0.17, 0.44, 0.28, _WHITE)


# --------------------------------------------------------------------------------------------
# Class table
# --------------------------------------------------------------------------------------------


def _speed_sign(digits: str) -> Callable[[_Frame], None]:
    def paint(f: _Frame) -> None:
        _prohibitory(f)
        _speed(f, digits)

    return paint


def _warning_sign(
    picto: Callable[[_Frame], None], mirror: bool = False
) -> Callable[[_Frame], None]:
    def paint(f: _Frame) -> None:
        p = _warning(f)
        picto(p.sub(0.0, 0.0, 1.0, mirror=mirror) if mirror else p)

    return paint


def _mandatory_sign(
    picto: Callable[[_Frame], None], mirror: bool = False
) -> Callable[[_Frame], None]:
    def paint(f: _Frame) -> None:
        _mandatory(f)
        picto(f.sub(0.0, 0.0, 1.0, mirror=mirror))

    return paint


def _paint_end_80(f: _Frame) -> None:
    _end_disc(f)
    _speed(f, "80", _END_GREY)
    _end_bars(f)


def _paint_no_passing(f: _Frame) -> None:
    _prohibitory(f)
    _two_vehicles(f, _car_back, _RED, _BLACK)


def _paint_no_passing_trucks(f: _Frame) -> None:
    _prohibitory(f)
    _two_vehicles(f, _truck_back, _RED, _BLACK)


def _paint_priority(f: _Frame) -> None:
    diamond = [(0.0, -0.97), (0.97, 0.0), (0.0, 0.97), (-0.97, 0.0)]
    r = 0.97 * math.sqrt(0.5)
    _rounded_regular(f, diamond, (0.0, 0.0), r, 0.05, _RIM_GREY)
    _rounded_regular(f, _inset(diamond, (0.0, 0.0), r, 0.025), (0.0, 0.0), r - 0.025, 0.04, _WHITE)
    _rounded_regular(f, _inset(diamond, (0.0, 0.0), r, 0.22), (0.0, 0.0), r - 0.22, 0.03, _YELLOW)


def _paint_yield(f: _Frame) -> None:
    _rounded_regular(f, _TRI_DOWN, _TRI_DOWN_C, _TRI_R, 0.1, _WHITE)
    red = _inset(_TRI_DOWN, _TRI_DOWN_C, _TRI_R, 0.035)
    _rounded_regular(f, red, _TRI_DOWN_C, _TRI_R - 0.035, 0.08, _RED)
    inner = _inset(_TRI_DOWN, _TRI_DOWN_C, _TRI_R, 0.25)
    _rounded_regular(f, inner, _TRI_DOWN_C, _TRI_R - 0.25, 0.03, _WHITE)


def _octagon(apothem: float) -> list[Pt]:
    rc = apothem / math.cos(math.pi / 8.0)
    return [
        (rc * math.cos(math.radians(22.5 + 45.0 * k)), rc * math.sin(math.radians(22.5 + 45.0 * k)))
        for k in range(8)
    ]


def _paint_stop(f: _Frame) -> None:
    _rounded_regular(f, _octagon(0.96), (0.0, 0.0), 0.96, 0.04, _WHITE)
    _rounded_regular(f, _octagon(0.91), (0.0, 0.0), 0.91, 0.03, _RED)
    _text(f, "STOP", 0.0, 0.0, 0.5, 0.32, 0.07, 0.1, _WHITE)


def _paint_no_vehicles(f: _Frame) -> None:
    _prohibitory(f)


def _paint_trucks_prohibited(f: _Frame) -> None:
    _prohibitory(f)
    _truck_side(f.sub(0.0, 0.02, 0.56), _BLACK)


def _paint_no_entry(f: _Frame) -> None:
    f.circle(0, 0, 0.96, _WHITE)
    f.circle(0, 0, 0.925, _RED)
    f.rect(-0.66, -0.15, 0.66, 0.15, _WHITE)


def _paint_end_all(f: _Frame) -> None:
    _end_disc(f)
    _end_bars(f)


def _paint_end_no_passing(f: _Frame) -> None:
    _end_disc(f)
    _two_vehicles(f, _car_back, _END_GREY, _END_GREY)
    _end_bars(f)


def _paint_end_no_passing_trucks(f: _Frame) -> None:
    _end_disc(f)
    _two_vehicles(f, _truck_back, _END_GREY, _END_GREY)
    _end_bars(f)


_PAINTERS: tuple[Callable[[_Frame], None], ...] = (
    _speed_sign("20"),
    _speed_sign("30"),
    _speed_sign("50"),
    _speed_sign("60"),
    _speed_sign("70"),
    _speed_sign("80"),
    _paint_end_80,
    _speed_sign("100"),
    _speed_sign("120"),
    _paint_no_passing,
    _paint_no_passing_trucks,
    _warning_sign(_cross),
    _paint_priority,
    _paint_yield,
    _paint_stop,
    _paint_no_vehicles,
    _paint_trucks_prohibited,
    _paint_no_entry,
    _warning_sign(_exclamation),
    _warning_sign(_curve),
    _warning_sign(_curve, mirror=True),
    _warning_sign(_double_curve),
    _warning_sign(_bumpy),
    _warning_sign(_slippery),
    _warning_sign(_narrows_right),
    _warning_sign(_road_work),
    _warning_sign(_signals),
    _warning_sign(_pedestrian),
    _warning_sign(_children),
    _warning_sign(_bicycle),
    _warning_sign(_snowflake),
    _warning_sign(_deer),
    _paint_end_all,
    _mandatory_sign(_turn),
    _mandatory_sign(_turn, mirror=True),
    _mandatory_sign(_ahead),
    _mandatory_sign(_straight_or_right),
    _mandatory_sign(_straight_or_right, mirror=True),
    _mandatory_sign(_keep_right),
    _mandatory_sign(_keep_right, mirror=True),
    _mandatory_sign(_roundabout),
    _paint_end_no_passing,
    _paint_end_no_passing_trucks,
)
assert len(_PAINTERS) == NUM_CLASSES


@cache
def _canonical(class_id: int, res: int) -> Image.Image:
    """The canonical sign of a class on a transparent ``res`` x ``res`` canvas (mode RGBa).

    Drawn at ``_SUPERSAMPLE`` times the resolution and box-filtered down for anti-aliasing.
    The returned image is shared; callers must not modify it.
    """
    big = res * _SUPERSAMPLE
    img = Image.new("RGBA", (big, big), (0, 0, 0, 0))
    _PAINTERS[class_id](_Frame(ImageDraw.Draw(img), big / 2.0))
    return img.convert("RGBa").resize((res, res), Image.Resampling.BOX)


# --------------------------------------------------------------------------------------------
# Randomised scene
# --------------------------------------------------------------------------------------------


def _work_res(size: int) -> int:
    """Internal rendering resolution: a multiple of ``size`` of at least 128 and 2 * size."""
    return size * max(2, math.ceil(128 / size))


@lru_cache(maxsize=8)
def _grid(res: int) -> tuple[np.ndarray, np.ndarray]:
    c = (np.arange(res, dtype=np.float32) + 0.5) / res * 2.0 - 1.0
    return c[None, :, None], c[:, None, None]


def _palette_colour(rng: np.random.Generator, kind: int) -> np.ndarray:
    if kind == 0:  # sky / overcast
        if rng.random() < 0.5:
            v = rng.uniform(150, 235)
            return np.array([v * rng.uniform(0.6, 0.85), v * rng.uniform(0.75, 0.95), v])
        v = rng.uniform(120, 230)
        return np.array([v, v, v]) * rng.uniform(0.93, 1.05, 3)
    if kind == 1:  # foliage
        g = rng.uniform(50, 170)
        return np.array([g * rng.uniform(0.3, 0.8), g, g * rng.uniform(0.2, 0.6)])
    if kind == 2:  # buildings, walls, road
        v = rng.uniform(50, 210)
        return v * np.array([1.0, rng.uniform(0.85, 1.0), rng.uniform(0.65, 1.0)])
    if kind == 3:  # dark / shadow / dusk
        return rng.uniform(5, 70, 3)
    sat = rng.uniform(0.0, 0.6)  # anything, moderately saturated
    return rng.uniform(30, 220) * (1.0 - sat) + rng.uniform(20, 235, 3) * sat


def _background(
    rng: np.random.Generator, res: int, pole: tuple[float, float, float] | None
) -> np.ndarray:
    """Random cluttered background, float32 [res, res, 3] in 0..255.

    ``pole`` is ``(x, y, width)`` in pixels: a grey post from ``(x, y)`` down to the bottom.
    """
    kind = int(rng.integers(5))
    c1 = _palette_colour(rng, kind)
    c2 = np.clip(c1 + rng.normal(0, 30, 3), 0, 255)
    xg, yg = _grid(res)
    ang = rng.uniform(0, 2 * math.pi)
    t = (xg * math.cos(ang) + yg * math.sin(ang)) * 0.5 + 0.5
    img = c1.astype(np.float32) + (c2 - c1).astype(np.float32) * t

    g = int(rng.integers(2, 8))
    amp = rng.uniform(5, 35)
    noise = rng.normal(0, amp, (g, g, 1)) + rng.normal(0, amp * 0.25, (g, g, 3))
    small = np.clip(128 + noise, 0, 255).astype(np.uint8)
    tex = Image.fromarray(small).resize((res, res), Image.Resampling.BICUBIC)
    img += np.asarray(tex, dtype=np.float32) - 128.0

    pil = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(pil)
    for _ in range(int(rng.integers(0, 7))):
        k = kind if rng.random() < 0.6 else int(rng.integers(5))
        col = tuple(int(v) for v in np.clip(_palette_colour(rng, k), 0, 255))
        x0, y0 = rng.uniform(-0.3, 1.0, 2) * res
        w, h = rng.uniform(0.08, 0.6, 2) * res
        if rng.random() < 0.6:
            draw.ellipse([x0, y0, x0 + w, y0 + h], fill=col)
        else:
            draw.rectangle([x0, y0, x0 + w, y0 + h], fill=col)
    for _ in range(int(rng.integers(0, 4))):
        col = tuple(int(v) for v in np.clip(_palette_colour(rng, int(rng.integers(5))), 0, 255))
        p = rng.uniform(-0.1, 1.1, 4) * res
        draw.line(
            [(p[0], p[1]), (p[2], p[3])], fill=col, width=int(rng.integers(1, max(2, res // 20)))
        )
    if pole is not None:
        px, py, pw = pole
        v = int(rng.uniform(70, 190))
        draw.rectangle([px - pw / 2, py, px + pw / 2, res], fill=(v, v, v))
    blur = rng.uniform(0.0, 1.5) * res / 64.0
    if blur > 0.4:
        pil = pil.filter(ImageFilter.GaussianBlur(blur))
    return np.asarray(pil, dtype=np.float32)


def _perspective_coeffs(dst: np.ndarray, src: np.ndarray) -> tuple[float, ...]:
    """Coefficients of the PIL PERSPECTIVE transform mapping output ``dst`` to input ``src``."""
    a = np.zeros((8, 8))
    b = np.zeros(8)
    for i, ((x, y), (u, v)) in enumerate(zip(dst, src, strict=True)):
        a[2 * i] = [x, y, 1, 0, 0, 0, -u * x, -u * y]
        a[2 * i + 1] = [0, 0, 0, x, y, 1, -v * x, -v * y]
        b[2 * i] = u
        b[2 * i + 1] = v
    return tuple(float(c) for c in np.linalg.solve(a, b))


def _place(
    sign: Image.Image,
    res: int,
    scale: float,
    centre: tuple[float, float],
    angle: float = 0.0,
    yaw: float = 0.0,
    pitch: float = 0.0,
) -> Image.Image:
    """Warp the canonical sign onto a ``res`` x ``res`` canvas (mode RGBa)."""
    corners = np.array([[-1.0, -1.0], [1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]])
    cy_, sy_ = math.cos(yaw), math.sin(yaw)
    cp_, sp_ = math.cos(pitch), math.sin(pitch)
    x, y = corners[:, 0], corners[:, 1]
    # rotate about the vertical axis (yaw), then the horizontal axis (pitch); pinhole project
    x1, z1 = x * cy_, -x * sy_
    y2, z2 = y * cp_ - z1 * sp_, y * sp_ + z1 * cp_
    focal = 3.5
    k = focal / (focal + z2)
    px, py = x1 * k, y2 * k
    ca, sa = math.cos(angle), math.sin(angle)
    half = scale / _SIGN_EXTENT * res / 2.0
    dst = np.stack(
        [centre[0] + half * (ca * px - sa * py), centre[1] + half * (sa * px + ca * py)], axis=1
    )
    n = sign.size[0]
    src = np.array([[0.0, 0.0], [n, 0.0], [n, n], [0.0, n]])
    coeffs = _perspective_coeffs(dst, src)
    return sign.transform(
        (res, res), Image.Transform.PERSPECTIVE, coeffs, Image.Resampling.BILINEAR
    )


def _clean(class_id: int, size: int) -> np.ndarray:
    res = _work_res(size)
    sign = _place(_canonical(class_id, res), res, 0.86, (res / 2.0, res / 2.0))
    arr = np.asarray(sign, dtype=np.float32)
    alpha = arr[..., 3:] / 255.0
    out = 128.0 * (1.0 - alpha) + arr[..., :3]
    pil = Image.fromarray(np.clip(out + 0.5, 0, 255).astype(np.uint8))
    return np.asarray(pil.resize((size, size), Image.Resampling.BOX), dtype=np.uint8)


def render_sign(
    class_id: int, rng: np.random.Generator, size: int = 32, variation: bool = True
) -> np.ndarray:
    """Render one GTSRB-like image of ``class_id``.

    Args:
        class_id: GTSRB class id in ``0..42``.
        rng: random generator driving every random choice (the only source of randomness).
        size: output side length in pixels.
        variation: if False, return the clean canonical sign centred on a plain grey
            background (``rng`` is not used); otherwise apply background clutter, lighting,
            scale, rotation, perspective, blur, noise and occasional occlusion.

    Returns:
        ``uint8`` array of shape ``[size, size, 3]`` (RGB).
    """
    class_id = int(class_id)
    if not 0 <= class_id < NUM_CLASSES:
        raise ValueError(f"class_id must be in 0..{NUM_CLASSES - 1}, got {class_id}")
    size = int(size)
    if size < 4:
        raise ValueError(f"size must be >= 4, got {size}")
    if not variation:
        return _clean(class_id, size)

    # The sign is warped at ``res`` (>= 4x supersampled canonical drawing) and box-filtered to
    # ``mid`` = 2 * size, where the background, compositing, occlusion and blur happen.
    res = _work_res(size)
    mid = 2 * size
    # geometry, in units of the frame side
    scale = rng.uniform(0.55, 0.95)
    shift = max(0.0, 1.0 - scale) / 2.0 * 0.85 + 0.02
    cx, cy = 0.5 + rng.uniform(-shift, shift), 0.5 + rng.uniform(-shift, shift)
    angle = math.radians(rng.uniform(-10.0, 10.0))
    yaw = math.radians(rng.uniform(-30.0, 30.0))
    pitch = math.radians(rng.uniform(-15.0, 15.0))
    pole = None
    if rng.random() < 0.4:
        pole = (cx * mid, cy * mid, rng.uniform(0.04, 0.08) * mid)

    bg = _background(rng, mid, pole)
    placed = _place(_canonical(class_id, res), res, scale, (cx * res, cy * res), angle, yaw, pitch)
    if res != mid:
        placed = placed.resize((mid, mid), Image.Resampling.BOX)
    sign = np.asarray(placed, dtype=np.float32)
    alpha = sign[..., 3:] / 255.0
    rgb = sign[..., :3]

    # sign appearance: fading towards grey, per-channel tint and a soft shading ramp
    if rng.random() < 0.5:
        fade = rng.uniform(0.0, 0.3)
        grey = rgb.mean(axis=2, keepdims=True)
        rgb = (1.0 - fade) * rgb + fade * (0.6 * grey + 80.0 * alpha)
    tint = rng.uniform(0.92, 1.06, 3).astype(np.float32)
    xg, yg = _grid(mid)
    ang = rng.uniform(0, 2 * math.pi)
    shade = 1.0 + rng.uniform(-0.25, 0.25) * (xg * math.cos(ang) + yg * math.sin(ang))
    img = bg * (1.0 - alpha) + rgb * (shade * tint)
    pil = Image.fromarray(np.clip(img + 0.5, 0, 255).astype(np.uint8))

    # occasional small occluder on the rim (leaf, branch, another object)
    if rng.random() < 0.12:
        r_sign = scale * mid / 2.0
        th = rng.uniform(0, 2 * math.pi)
        ox = cx * mid + 0.95 * r_sign * math.cos(th)
        oy = cy * mid + 0.95 * r_sign * math.sin(th)
        orad = r_sign * rng.uniform(0.18, 0.35)
        col = tuple(int(v) for v in np.clip(_palette_colour(rng, int(rng.integers(5))), 0, 255))
        draw = ImageDraw.Draw(pil)
        if rng.random() < 0.5:
            ry0, ry1 = orad * rng.uniform(0.5, 1.0), orad * rng.uniform(0.5, 1.0)
            draw.ellipse([ox - orad, oy - ry0, ox + orad, oy + ry1], fill=col)
        else:
            pts = [
                (
                    ox + orad * math.cos(a) * rng.uniform(0.5, 1.2),
                    oy + orad * math.sin(a) * rng.uniform(0.5, 1.2),
                )
                for a in np.linspace(0, 2 * math.pi, 6, endpoint=False)
            ]
            draw.polygon(pts, fill=col)

    # optics: defocus blur (at twice the output size), downsampling, low-resolution capture
    blur = rng.uniform(0.0, 0.9) * mid / 64.0
    if blur > 0.15:
        pil = pil.filter(ImageFilter.GaussianBlur(blur))
    pil = pil.resize((size, size), Image.Resampling.BOX)
    if rng.random() < 0.15:  # low-resolution capture, upsampled again
        low = max(4, int(round(size * rng.uniform(0.55, 0.85))))
        pil = pil.resize((low, low), Image.Resampling.BOX).resize(
            (size, size), Image.Resampling.BILINEAR
        )
    out = np.asarray(pil, dtype=np.float32)

    # global lighting: brightness, contrast, colour cast, illumination gradient; sensor noise
    bright = float(np.clip(math.exp(rng.normal(0.0, 0.35)), 0.3, 1.6))
    contrast = rng.uniform(0.6, 1.15)
    cast = np.exp(rng.normal(0.0, 0.05, 3)).astype(np.float32)
    xs, ys = _grid(size)
    ang = rng.uniform(0, 2 * math.pi)
    ramp = 1.0 + rng.uniform(0.0, 0.2) * (xs * math.cos(ang) + ys * math.sin(ang))
    mean = float(out.mean())
    out = ((out - mean) * contrast + mean) * (ramp * (bright * cast))
    sigma = rng.uniform(0.0, 9.0)
    out += rng.normal(0.0, sigma, out.shape).astype(np.float32)
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)


def generate(
    n_per_class: int,
    seed: int,
    size: int = 32,
    classes: Sequence[int] | None = None,
    start_index: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Generate a class-balanced synthetic data set.

    Image ``i`` of class ``c`` is rendered with a generator seeded from
    ``np.random.SeedSequence([seed, c, start_index + i])``, so any subset (a class, an index
    range) can be regenerated independently and byte-identically.

    Args:
        n_per_class: number of images per class.
        seed: non-negative integer seed.
        size: output side length in pixels.
        classes: class ids to generate (default: all 43, in order).
        start_index: index of the first image of each class.

    Returns:
        ``(x, y)``: ``x`` is ``uint8 [N, size, size, 3]`` (RGB), ``y`` is ``int64 [N]``;
        ordered class-major (all images of the first class, then the next, ...).
    """
    if n_per_class < 0:
        raise ValueError(f"n_per_class must be >= 0, got {n_per_class}")
    if seed < 0 or start_index < 0:
        raise ValueError("seed and start_index must be non-negative")
    cls = list(range(NUM_CLASSES)) if classes is None else [int(c) for c in classes]
    for c in cls:
        if not 0 <= c < NUM_CLASSES:
            raise ValueError(f"class id must be in 0..{NUM_CLASSES - 1}, got {c}")
    n = len(cls) * n_per_class
    x = np.empty((n, size, size, 3), dtype=np.uint8)
    y = np.empty(n, dtype=np.int64)
    k = 0
    for c in cls:
        for i in range(n_per_class):
            rng = np.random.default_rng(np.random.SeedSequence([seed, c, start_index + i]))
            x[k] = render_sign(c, rng, size)
            y[k] = c
            k += 1
    return x, y


def _label_font(px: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=px)
    except (TypeError, OSError, ImportError):  # old Pillow or no FreeType: bitmap font
        return ImageFont.load_default()


def contact_sheet(
    path: str | os.PathLike,
    seed: int = 0,
    per_class: int = 8,
    size: int = 32,
    scale: int = 2,
) -> None:
    """Write a PNG contact sheet: one row per class, ``per_class`` samples each.

    Samples are the images :func:`generate` produces for ``seed`` (indices ``0..per_class-1``),
    upscaled ``scale`` times with nearest-neighbour; each row is labelled with the class id and
    a short name on the left.
    """
    x, _ = generate(per_class, seed, size)
    tile = size * scale
    font = _label_font(max(10, min(14, tile // 3)))
    labels = [f"{c:2d} {_SHORT_NAMES[c]}" for c in range(NUM_CLASSES)]
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    label_w = int(max(probe.textlength(s, font=font) for s in labels)) + 10
    sheet = Image.new("RGB", (label_w + per_class * tile, NUM_CLASSES * tile), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for c in range(NUM_CLASSES):
        top = c * tile
        _, y0, _, y1 = draw.textbbox((0, 0), labels[c], font=font)
        draw.text((4, top + (tile - (y1 + y0)) // 2), labels[c], fill=(0, 0, 0), font=font)
        for j in range(per_class):
            im = Image.fromarray(x[c * per_class + j])
            if scale != 1:
                im = im.resize((tile, tile), Image.Resampling.NEAREST)
            sheet.paste(im, (label_w + j * tile, top))
    sheet.save(os.fspath(path), format="PNG")
