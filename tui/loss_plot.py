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
        pts = [(p.step, p.loss) for p in self.points if p.loss is not None]
        if not pts:
            return Content("no metrics yet (metrics.jsonl gets a row every train.log_every steps)")
        evals = [(p.step, p.eval_loss) for p in self.points if p.eval_loss is not None]
        head = [f"eval loss {evals[-1][1]:.4f} at step {evals[-1][0]}"] if evals else []
        height = self.content_size.height - len(head)
        lines = chart([s for s, _ in pts], [v for _, v in pts], self.content_size.width, height)
        return Content("\n".join(head + lines))
