"""The Sweeps screen's chart: the loss curves of a sweep's shown points on one pair of axes, each
point in its own colour (six colours, in turn), its eval loss in the same colour."""

from __future__ import annotations

from .metric_chart import MetricChart
from .plot import AXIS

COLOURS = 6
TAGS = (AXIS, *(f"p{i}" for i in range(COLOURS)))


def tag(index: int) -> str:
    """The tag (and so the colour) of point `index`."""
    return f"p{index % COLOURS}"


class SweepChart(MetricChart):
    COMPONENT_CLASSES = {f"metric-chart--{t or 'axis'}" for t in TAGS}
    TAGS = TAGS
