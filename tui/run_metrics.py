"""What the run screen plots: one chart per metric (loss with the eval loss on the same axes,
learning rate, gradient norm, tokens/s), each titled with its latest values, with TensorBoard's
smoothing applied to the noisy ones. Pure functions over `metrics_tail.Point`s."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from textual.content import Content

from .metrics_tail import Point
from .plot import Series

SMOOTHING = (0.0, 0.6, 0.9, 0.99)  # what s cycles through; 0.6 is TensorBoard's default
DEFAULT_SMOOTHING = 0.6


def smooth(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average, debiased so the first values
    are not pulled towards zero."""
    if weight <= 0:
        return list(values)
    out, last = [], 0.0
    for i, value in enumerate(values, 1):
        last = last * weight + (1 - weight) * value
        out.append(last / (1 - weight**i))
    return out


@dataclass(frozen=True)
class ChartData:
    key: str  # the chart widget's id
    title: Content
    series: list[Series]


def _values(points: list[Point], get: Callable[[Point], float | None]) -> tuple[list[int], list[float]]:
    pairs = [(p.step, v) for p in points if (v := get(p)) is not None]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _curve(points: list[Point], get: Callable[[Point], float | None], smoothing: float) -> list[Series]:
    """The raw values, and over them the smoothed line when smoothing is on."""
    xs, ys = _values(points, get)
    if smoothing <= 0:
        return [Series(xs, ys, "main")]
    return [Series(xs, ys, "raw"), Series(xs, smooth(ys, smoothing), "main")]


def _latest(points: list[Point], get: Callable[[Point], float | None]) -> float | None:
    return next((v for p in reversed(points) if (v := get(p)) is not None), None)


def _title(name: str, value: float | None, fmt: str, extra: str = "") -> Content:
    shown = "-" if value is None else format(value, fmt)
    return Content.from_markup("[$primary]$name[/] [b]$value[/]$extra", name=name, value=shown, extra=extra)


def charts(points: list[Point], smoothing: float, per: str) -> list[ChartData]:
    """The four charts; `per` is what tokens_per_s_per_gpu is per: "GPU", or "rank" on CPU."""
    eval_xs, eval_ys = _values(points, lambda p: p.eval_loss)
    loss_title = _title("loss", _latest(points, lambda p: p.loss), ".4f")
    if eval_ys:
        loss_title += Content.from_markup("  [$warning]eval[/] [b]$value[/]", value=f"{eval_ys[-1]:.4f}")
    per_worker = _latest(points, lambda p: p.tokens_per_s_per_gpu)
    return [
        ChartData("loss", loss_title, [*_curve(points, lambda p: p.loss, smoothing), Series(eval_xs, eval_ys, "eval")]),
        ChartData("lr", _title("lr", _latest(points, lambda p: p.lr), ".2e"), _curve(points, lambda p: p.lr, 0.0)),
        ChartData(
            "grad_norm",
            _title("grad norm", _latest(points, lambda p: p.grad_norm), ".3f"),
            _curve(points, lambda p: p.grad_norm, smoothing),
        ),
        ChartData(
            "tokens_per_s",
            _title(
                "tokens/s",
                _latest(points, lambda p: p.tokens_per_s),
                ",.0f",
                f"  {per_worker:,.0f} per {per}" if per_worker is not None else "",
            ),
            _curve(points, lambda p: p.tokens_per_s, smoothing),
        ),
    ]
