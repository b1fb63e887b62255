"""What the run screen plots: one chart per metric (loss with the eval loss on the same axes,
learning rate, gradient norm, tokens/s), each titled with its latest values, with TensorBoard's
smoothing applied to the noisy ones. Pure functions over `metrics_tail.Metrics`."""

from __future__ import annotations

from dataclasses import dataclass

from textual.content import Content

from .metrics_tail import Metrics
from .plot import Series

SMOOTHING = (0.0, 0.6, 0.9, 0.99)  # what s cycles through; 0.6 is TensorBoard's default
DEFAULT_SMOOTHING = 0.6
MAX_POINTS = 2000  # per series handed to a chart: more than any terminal has dots across


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


def decimate(xs: list[int], ys: list[float], limit: int = MAX_POINTS) -> tuple[list[int], list[float]]:
    """At most `limit` points that draw like all of them: each bucket of consecutive points keeps
    its lowest and its highest one (in step order), so a loss spike is never sampled away; the
    first and the last point are always kept."""
    if len(xs) <= limit:
        return xs, ys
    size = -(-4 * len(xs) // limit)  # up to 4 points a bucket (low, high, first, last)
    out_x, out_y = [], []
    for start in range(0, len(xs), size):
        bucket = range(start, min(start + size, len(xs)))
        keep = {min(bucket, key=ys.__getitem__), max(bucket, key=ys.__getitem__)}
        keep |= {i for i in (0, len(xs) - 1) if i in bucket}  # the first and last step: the x axis stays
        for i in sorted(keep):
            out_x.append(xs[i])
            out_y.append(ys[i])
    return out_x, out_y


@dataclass(frozen=True)
class ChartData:
    key: str  # the chart widget's id
    title: Content
    series: list[Series]


def _curve(metrics: Metrics, key: str, smoothing: float) -> list[Series]:
    """The raw values, and over them the smoothed line when smoothing is on (smoothed over every
    point, then both cut down to what a chart can show)."""
    xs, ys = metrics.series(key)
    if smoothing <= 0:
        return [Series(*decimate(xs, ys), "main")]
    return [Series(*decimate(xs, ys), "raw"), Series(*decimate(xs, smooth(ys, smoothing)), "main")]


def _title(name: str, value: float | None, fmt: str, extra: str = "") -> Content:
    shown = "-" if value is None else format(value, fmt)
    return Content.from_markup("[$primary]$name[/] [b]$value[/]$extra", name=name, value=shown, extra=extra)


def _with_held_out(chart: str, name: str, key: str, fmt: str, metrics: Metrics, smoothing: float) -> ChartData:
    """A training curve and, on the same axes in its own colour, its held-out twin (`eval_<key>`),
    the latest of each in the title."""
    eval_xs, eval_ys = metrics.series(f"eval_{key}")
    title = _title(name, metrics.latest(key), fmt)
    if eval_ys:
        title += Content.from_markup("  [$warning]eval[/] [b]$value[/]", value=format(eval_ys[-1], fmt))
    return ChartData(chart, title, [*_curve(metrics, key, smoothing), Series(*decimate(eval_xs, eval_ys), "eval")])


# What a preference run is judged by, in order: pairs (dpo, ipo, simpo, orpo) have an accuracy;
# kto's unpaired examples only the margin between the desirable and the undesirable rewards.
JUDGED_BY = (("reward_accuracy", "reward accuracy", ".2f"), ("reward_margin", "reward margin", ".3f"))


def _second(metrics: Metrics, smoothing: float) -> ChartData:
    """The learning rate; for a preference run (train.objective) the reward accuracy (kto: the
    reward margin), with the held-out one on the same axes and the learning rate in the title:
    what the objective is judged by."""
    lr = metrics.latest("lr")
    judged = [j for j in JUDGED_BY if metrics.latest(j[0]) is not None or metrics.series(f"eval_{j[0]}")[1]]
    if not judged:
        return ChartData("lr", _title("lr", lr, ".2e"), _curve(metrics, "lr", 0.0))
    key, name, fmt = judged[0]
    chart = _with_held_out("lr", name, key, fmt, metrics, smoothing)
    if lr is None:
        return chart
    return ChartData(chart.key, chart.title + Content.from_markup("  lr $value", value=f"{lr:.2e}"), chart.series)


def charts(metrics: Metrics, smoothing: float, per: str) -> list[ChartData]:
    """The four charts; `per` is what tokens_per_s_per_gpu is per: "GPU", or "rank" on CPU."""
    per_worker = metrics.latest("tokens_per_s_per_gpu")
    per_text = f"  {per_worker:,.0f} per {per}" if per_worker is not None else ""
    return [
        _with_held_out("loss", "loss", "loss", ".4f", metrics, smoothing),
        _second(metrics, smoothing),
        ChartData(
            "grad_norm",
            _title("grad norm", metrics.latest("grad_norm"), ".3f"),
            _curve(metrics, "grad_norm", smoothing),
        ),
        ChartData(
            "tokens_per_s",
            _title("tokens/s", metrics.latest("tokens_per_s"), ",.0f", per_text),
            _curve(metrics, "tokens_per_s", smoothing),
        ),
    ]
