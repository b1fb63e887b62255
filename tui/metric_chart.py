"""One metric's chart on the run screen: braille lines that redraw to the widget's size, each
series coloured by its component class (raw values dim, the smoothed line bright, the eval loss
in its own colour; benchmark scores: main, eval, b2, b3). Focusable, so tab moves between
charts and z enlarges the focused one."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from .plot import AXIS, Series, chart

TAGS = (AXIS, "raw", "main", "eval", "b2", "b3")


class MetricChart(Widget, can_focus=True):
    COMPONENT_CLASSES = {f"metric-chart--{tag or 'axis'}" for tag in TAGS}

    TAGS = TAGS  # the tags its series use, each styled by the component class metric-chart--<tag>

    series: reactive[list[Series]] = reactive(list, always_update=True)

    def __init__(self, empty: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.empty = empty  # shown while there is nothing to plot

    def render(self) -> Text:
        lines = chart(self.series, self.content_size.width, self.content_size.height)
        if not lines:
            return Text(self.empty if not any(s.xs for s in self.series) else "", style=self.rich_style)
        styles = {tag: self.get_component_rich_style(f"metric-chart--{tag or 'axis'}") for tag in self.TAGS}
        text = Text(no_wrap=True, end="")
        for i, line in enumerate(lines):
            if i:
                text.append("\n")
            for part, tag in line:
                text.append(part, styles[tag])
        return text
