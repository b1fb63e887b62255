"""Line charts drawn with braille characters (2×4 dots per cell), for the run screen's metrics.

Several series share one pair of axes (a raw curve, its smoothed line, the eval loss); each
cell is tagged with the series drawn last in it, so the widget can colour it. Axis ticks are
round numbers (1, 2, 2.5 or 5 times a power of ten) labelled compactly (`3e-4`, `21.4k`), so a
chart stays readable at 80×24. Text and tags out, no widget: the drawing is unit-tested.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

_BRAILLE = 0x2800
# Dot bit for (row, column) inside one braille cell.
_DOT = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
AXIS = ""  # the tag of axis lines and labels


@dataclass(frozen=True)
class Series:
    xs: Sequence[float]
    ys: Sequence[float]
    tag: str  # how the widget colours it, e.g. "raw", "main", "eval"


Run = tuple[str, str]  # (text, tag)


def plain(line: list[Run]) -> str:
    return "".join(text for text, _ in line)


def nice_step(span: float, count: int) -> float:
    """The round step (1, 2, 2.5 or 5 × 10^k) that cuts `span` into about `count` pieces."""
    raw = span / max(1, count)
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw * (1 - 1e-9))


def ticks(lo: float, hi: float, step: float) -> list[float]:
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    return [k * step for k in range(first, last + 1)]


def labels(values: Sequence[float], step: float) -> list[str]:
    """Tick labels in one format per axis, with no more digits than the step needs:
    0.25 0.5 0.75 · 1e-4 2e-4 3e-4 · 20.5k 21k · 0 500 1000."""
    top = max((abs(v) for v in values), default=0.0)
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if top >= 10 * factor:
            return [_fixed(v / factor, step / factor) + (suffix if v else "") for v in values]
    if step < 1e-3:
        return [_scientific(v, step) for v in values]
    return [_fixed(v, step) for v in values]


def _scientific(value: float, step: float) -> str:
    if abs(value) < step / 2:
        return "0"
    exponent = math.floor(math.log10(abs(value)))
    mantissa = value / 10**exponent
    return f"{mantissa:.{_decimals(step / 10**exponent)}f}e{exponent}"


def _decimals(step: float) -> int:
    """Digits after the point that multiples of `step` need (2.5 -> 1, 0.05 -> 2, 500 -> 0)."""
    for d in range(12):
        if abs(step * 10**d - round(step * 10**d)) < 1e-6 * max(1.0, step * 10**d):
            return d
    return 12


def _fixed(value: float, step: float) -> str:
    return f"{value:.{_decimals(step)}f}"


def _finite(s: Series) -> tuple[list[float], list[float]]:
    pairs = [(x, y) for x, y in zip(s.xs, s.ys, strict=False) if math.isfinite(x) and math.isfinite(y)]
    return [x for x, _ in pairs], [y for _, y in pairs]


def chart(series: Sequence[Series], width: int, height: int) -> list[list[Run]]:
    """`height` lines of `width` cells: y tick labels and axis on the left, the series drawn in
    braille, x tick labels on the last line. Empty if there is nothing to draw or no room."""
    data = [(s.tag, *_finite(s)) for s in series]
    data = [(tag, xs, ys) for tag, xs, ys in data if xs]
    if not data or width < 12 or height < 3:
        return []
    rows = height - 1
    x0, x1 = min(min(xs) for _, xs, _ in data), max(max(xs) for _, xs, _ in data)
    lo, hi = min(min(ys) for _, _, ys in data), max(max(ys) for _, _, ys in data)
    if hi == lo:  # a flat line: put it in the middle of a small range around it
        lo, hi = lo - (abs(lo) * 0.1 or 1), hi + (abs(hi) * 0.1 or 1)
    y_step = nice_step(hi - lo, max(1, rows // 2))  # ticks inside the data's range: no row is wasted
    y_labels: dict[int, str] = {}
    y_ticks = ticks(lo, hi, y_step)
    for value, text in zip(y_ticks, labels(y_ticks, y_step), strict=True):
        y_labels.setdefault(round((hi - value) / (hi - lo) * (rows - 1)), text)
    pad = max(map(len, y_labels.values()), default=0)  # a chart only a few rows high may have no tick
    cols = width - pad - 1
    if cols < 4:
        return []
    bits = [[0] * cols for _ in range(rows)]
    tags = [[AXIS] * cols for _ in range(rows)]
    for tag, xs, ys in data:
        stride = max(1, len(xs) // (cols * 4))  # more points than dots only costs time
        xs, ys = [*xs[::stride], xs[-1]], [*ys[::stride], ys[-1]]
        for r, c, b in _dots(xs, ys, cols, rows, (x0, x1), (lo, hi)):
            bits[r][c] |= b
            tags[r][c] = tag
    lines: list[list[Run]] = []
    for r in range(rows):
        axis = f"{y_labels.get(r, ''):>{pad}}" + ("┤" if r in y_labels else "│")
        line: list[Run] = [(axis, AXIS)]
        for c in range(cols):
            char = chr(_BRAILLE + bits[r][c])
            if line[-1][1] == tags[r][c]:
                line[-1] = (line[-1][0] + char, tags[r][c])
            else:
                line.append((char, tags[r][c]))
        lines.append(line)
    lines.append([(" " * pad + "└" + _x_labels(x0, x1, cols), AXIS)])
    return lines


def _x_labels(x0: float, x1: float, cols: int) -> str:
    """Round x values written where they fall on the axis, left-aligned at their column (the
    last one may end at the axis's end instead), with at least two spaces between labels."""
    out = [" "] * cols
    if x1 <= x0:
        text = labels([x0], 1)[0]
        out[: len(text)] = text
        return "".join(out)[:cols]
    step = nice_step(x1 - x0, max(1, cols // 10))
    values = ticks(x0, x1, step)
    end = -2
    for value, text in zip(values, labels(values, step), strict=True):
        col = min(round((value - x0) / (x1 - x0) * (cols - 1 / 2)), cols - len(text))  # the last one ends at the edge
        if col >= end + 2:
            out[col : col + len(text)] = text
            end = col + len(text)
    return "".join(out)


def _dots(
    xs: Sequence[float],
    ys: Sequence[float],
    cols: int,
    rows: int,
    x_range: tuple[float, float],
    y_range: tuple[float, float],
) -> list[tuple[int, int, int]]:
    """(row, column, bit) of each dot on the lines joining the points (Bresenham)."""
    width, height = cols * 2, rows * 4
    (x0, x1), (y0, y1) = x_range, y_range

    def pixel(x: float, y: float) -> tuple[int, int]:
        px = round((x - x0) / (x1 - x0) * (width - 1)) if x1 > x0 else 0
        py = height - 1 - round((y - y0) / (y1 - y0) * (height - 1))
        return min(max(px, 0), width - 1), min(max(py, 0), height - 1)

    out: list[tuple[int, int, int]] = []

    def dot(px: int, py: int) -> None:
        out.append((py // 4, px // 2, _DOT[py % 4][px % 2]))

    prev: tuple[int, int] | None = None
    for x, y in zip(xs, ys, strict=False):
        cur = pixel(x, y)
        if prev is None:
            dot(*cur)
        else:
            (ax, ay), (bx, by) = prev, cur
            dx, dy = abs(bx - ax), -abs(by - ay)
            sx, sy = (1 if bx > ax else -1), (1 if by > ay else -1)
            err = dx + dy
            while True:
                dot(ax, ay)
                if (ax, ay) == (bx, by):
                    break
                e2 = 2 * err
                if e2 >= dy:
                    err, ax = err + dy, ax + sx
                if e2 <= dx:
                    err, ay = err + dx, ay + sy
        prev = cur
    return out
