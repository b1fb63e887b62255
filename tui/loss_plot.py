"""The loss curve of a run: a braille line chart that redraws to the widget's size."""

from __future__ import annotations

from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

from .metrics_tail import Point
from .plot import chart


class LossPlot(Widget):
    points: reactive[list[Point]] = reactive(list, always_update=True)

    def render(self) -> Content:
        pts = [p for p in self.points if p.loss is not None]
        if not pts:
            return Content("no metrics yet (metrics.jsonl gets a row every train.log_every steps)")
        lines = chart([p.step for p in pts], [p.loss for p in pts], self.content_size.width, self.content_size.height)
        return Content("\n".join(lines))
