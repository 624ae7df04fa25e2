"""Axis-aligned boxes on a page, ``(x0, y0, x1, y1)``: their area, overlap and union.

>>> box_area(box_union((0, 0, 2, 1), (1, 0, 3, 2))), box_intersection((0, 0, 2, 2), (1, 1, 3, 3))
(6, 1)
"""

from __future__ import annotations

Box = tuple[float, float, float, float]


def box_area(box: Box) -> float:
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def box_intersection(a: Box, b: Box) -> float:
    """The area ``a`` and ``b`` share."""
    return box_area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))


def box_union(a: Box, b: Box) -> Box:
    """The smallest box holding both."""
    return (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))


__all__ = ["Box", "box_area", "box_intersection", "box_union"]
