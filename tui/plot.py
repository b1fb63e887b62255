"""A line chart drawn with braille characters (2×4 dots per cell), for the loss curve.

Plain text out, so the widget that shows it stays trivial and the drawing is unit-tested.
"""

from __future__ import annotations

from collections.abc import Sequence

_BRAILLE = 0x2800
# Dot bit for (row, column) inside one braille cell.
_DOT = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))


def _label(value: float) -> str:
    return f"{value:.4g}"


def braille(
    xs: Sequence[float],
    ys: Sequence[float],
    cols: int,
    rows: int,
    x_range: tuple[float, float],
    y_range: tuple[float, float],
) -> list[str]:
    """`rows` strings of `cols` braille cells with the points joined by straight segments."""
    width, height = cols * 2, rows * 4
    grid = [[0] * cols for _ in range(rows)]
    (x0, x1), (y0, y1) = x_range, y_range

    def pixel(x: float, y: float) -> tuple[int, int]:
        px = round((x - x0) / (x1 - x0) * (width - 1)) if x1 > x0 else 0
        py = height - 1 - (round((y - y0) / (y1 - y0) * (height - 1)) if y1 > y0 else height // 2)
        return px, py

    def dot(px: int, py: int) -> None:
        grid[py // 4][px // 2] |= _DOT[py % 4][px % 2]

    prev: tuple[int, int] | None = None
    for x, y in zip(xs, ys, strict=False):
        cur = pixel(x, y)
        if prev is None:
            dot(*cur)
        else:  # Bresenham from prev to cur
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
    return ["".join(chr(_BRAILLE + bits) for bits in row) for row in grid]


def chart(xs: Sequence[float], ys: Sequence[float], width: int, height: int) -> list[str]:
    """A chart that fills `width` × `height` cells: y labels on the left, first/last x below."""
    if not xs or width < 12 or height < 3:
        return []
    stride = max(1, len(xs) // (width * 4))  # more points than dots only costs time
    xs, ys = [*list(xs[::stride]), xs[-1]], [*list(ys[::stride]), ys[-1]]
    lo, hi = min(ys), max(ys)
    labels = [_label(hi), _label((lo + hi) / 2), _label(lo)]
    pad = max(map(len, labels))
    rows, cols = height - 1, width - pad - 1
    plot = braille(xs, ys, cols, rows, (xs[0], xs[-1]), (lo, hi))
    out = []
    for i, line in enumerate(plot):
        label = labels[0] if i == 0 else labels[2] if i == rows - 1 else labels[1] if i == rows // 2 else ""
        out.append(f"{label:>{pad}}│{line}")
    first, last = f"{xs[0]:g}", f"{xs[-1]:g}"
    out.append(" " * pad + "└" + first + last.rjust(cols - len(first)))
    return out
