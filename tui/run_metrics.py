"""What the run screen plots: one chart per metric (loss with the eval loss on the same axes,
learning rate, gradient norm, tokens/s), each titled with its latest values, with TensorBoard's
smoothing applied to the noisy ones; beside the loss, a run with benchmark results charts their
scores instead of the learning rate. Pure functions over `metrics_tail.Metrics` and the rows of
`<run>/benchmarks/` (core/benchresults.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from textual.content import Content

from clusterfsdp.core import benchresults

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


# The benchmark scores the chart beside the loss plots (a task's standard errors left out), each
# in its own colour: the chart widget's tags, the title's theme variables, in order.
BENCH_TAGS = (("main", "$primary"), ("eval", "$warning"), ("b2", "$success"), ("b3", "$error"))


def bench_names(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The scores to plot: `bench/<task>/<metric>` as first seen oldest row first, no standard
    errors, at most one per colour."""
    names: dict[str, None] = {}
    for row in rows:
        names.update((k, None) for k in benchresults.scores(row) if not benchresults.is_stderr(k))
    return list(names)[: len(BENCH_TAGS)]


def _benchmarks(rows: Sequence[dict[str, Any]]) -> ChartData | None:
    """Each score by checkpoint step, in its own colour, the latest of each in the title (named
    `<task>/<metric>`); None without a score."""
    series, title = [], Content("")
    for name, (tag, colour) in zip(bench_names(rows), BENCH_TAGS, strict=False):
        points = [(r["step"], float(v)) for r in rows if benchresults.is_score(v := r.get(name))]
        if not points:  # a score lm-eval could not compute (NaN, or null in a JSON copy)
            continue
        series.append(Series([s for s, _ in points], [v for _, v in points], tag))
        title += Content.from_markup(
            f"{'  ' if series[1:] else ''}[{colour}]$name[/] [b]$value[/]",
            name=name.removeprefix("bench/"),
            value=format(points[-1][1], ".4g"),
        )
    return ChartData("lr", title, series) if series else None


def _second(metrics: Metrics, smoothing: float, bench: Sequence[dict[str, Any]] = ()) -> ChartData:
    """The learning rate; for a preference run (train.objective) the reward accuracy (kto: the
    reward margin), with the held-out one on the same axes: what the objective is judged by;
    for a run with benchmark results, their scores (what the issue's users judge a fine-tune by,
    before the objective's own numbers). The learning rate goes to the title of the others."""
    lr = metrics.latest("lr")
    judged = [j for j in JUDGED_BY if metrics.latest(j[0]) is not None or metrics.series(f"eval_{j[0]}")[1]]
    chart = _benchmarks(bench)
    if chart is None and not judged:
        return ChartData("lr", _title("lr", lr, ".2e"), _curve(metrics, "lr", 0.0))
    if chart is None:
        key, name, fmt = judged[0]
        chart = _with_held_out("lr", name, key, fmt, metrics, smoothing)
    if lr is None:
        return chart
    return ChartData(chart.key, chart.title + Content.from_markup("  lr $value", value=f"{lr:.2e}"), chart.series)


def charts(metrics: Metrics, smoothing: float, per: str, bench: Sequence[dict[str, Any]] = ()) -> list[ChartData]:
    """The four charts; `per` is what tokens_per_s_per_gpu is per: "GPU", or "rank" on CPU;
    `bench` the run's benchmark rows (core/benchresults.rows), oldest step first."""
    per_worker = metrics.latest("tokens_per_s_per_gpu")
    per_text = f"  {per_worker:,.0f} per {per}" if per_worker is not None else ""
    return [
        _with_held_out("loss", "loss", "loss", ".4f", metrics, smoothing),
        _second(metrics, smoothing, bench),
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
