"""A window of a log file's lines: renders only the visible ones, holds at most `max_lines`.

It never reads files itself (the logs screen does, in workers, through `logtail`); it keeps
the byte offset of each line so the screen can read more above or below the window, and it
asks for that with an `Edge` message when scrolled to either end. Error lines and search
matches are highlighted; `follow` keeps the view on the newest line.
"""

from __future__ import annotations

import bisect
import re
from typing import Literal

from rich.text import Text
from textual.binding import Binding
from textual.events import MouseScrollUp
from textual.geometry import Size
from textual.message import Message
from textual.reactive import var
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .logtail import ERROR_TEXT, Chunk

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean(line: str) -> str:
    """Colour codes dropped, other control characters made visible, tabs expanded."""
    return _CONTROL.sub("�", _ANSI.sub("", line)).expandtabs()


class LogView(ScrollView, can_focus=True):
    COMPONENT_CLASSES = {"log-view--error", "log-view--match", "log-view--current"}
    BINDINGS = [Binding("end", "scroll_end", "Follow", show=False)]

    follow: var[bool] = var(True)
    """Keep the newest line in view as lines arrive."""

    class Edge(Message):
        """Scrolled to the first or last loaded line: the screen may read more of the file."""

        def __init__(self, view: LogView, where: Literal["before", "after"]) -> None:
            super().__init__()
            self.view, self.where = view, where

    def __init__(self, max_lines: int = 20_000, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.max_lines = max_lines
        self.lines: list[str] = []
        self.offsets: list[int] = []
        self.partial = False  # the last line has no newline yet
        self.end = 0  # file offset after the last complete line
        self.highlight: re.Pattern[str] | None = None
        self.current: int | None = None  # the line the last search or jump landed on
        self._width = 0

    # ---- content
    @property
    def start(self) -> int:
        return self.offsets[0] if self.offsets else self.end

    def _resize(self) -> None:
        self.virtual_size = Size(self._width, len(self.lines))

    def load(self, chunk: Chunk, at: int | None = None) -> None:
        """Replace the window; show the end, or the line at byte offset `at` (marked current)."""
        self.lines = [clean(line) for line in chunk.lines]
        self.offsets = list(chunk.offsets)
        self.partial, self.end = chunk.partial, chunk.end
        self._width = max(map(len, self.lines), default=0)
        self.current = None
        self._resize()
        if at is None:
            self._to_end()
        else:
            self.show_line(self.index_of(at))
        self.refresh()

    def message(self, text: str) -> None:
        """Show a note instead of a file (no log yet, a job without a run folder)."""
        self.load(Chunk(0, 0, text.splitlines(), [0] * len(text.splitlines())))

    def append(self, chunk: Chunk) -> None:
        """Lines read after the window; a partial last line read again replaces itself."""
        if self.partial and chunk.offsets and self.offsets and chunk.offsets[0] == self.offsets[-1]:
            self.lines.pop()
            self.offsets.pop()
        new = [clean(line) for line in chunk.lines]
        self.lines += new
        self.offsets += chunk.offsets
        self.partial, self.end = chunk.partial, chunk.end
        self._width = max(self._width, max(map(len, new), default=0))
        extra = len(self.lines) - self.max_lines
        if extra > 0:  # drop from the top; keep what is on screen where it is
            del self.lines[:extra], self.offsets[:extra]
            self.current = None if self.current is None or self.current < extra else self.current - extra
            self.scroll_to(y=max(0, self.scroll_y - extra), animate=False, immediate=True)
        self._resize()
        if self.follow:
            self._to_end()
        self.refresh()

    def prepend(self, chunk: Chunk) -> None:
        """Lines read before the window; the view stays on the same lines."""
        if not chunk.lines:
            return
        new = [clean(line) for line in chunk.lines]
        self.lines[:0] = new
        self.offsets[:0] = chunk.offsets
        self._width = max(self._width, max(map(len, new), default=0))
        if self.current is not None:
            self.current += len(new)
        extra = len(self.lines) - self.max_lines
        if extra > 0:  # drop from the bottom: the window no longer reaches its old end
            self.end = self.offsets[-extra]
            self.partial = False
            del self.lines[-extra:], self.offsets[-extra:]
        self._resize()
        self.scroll_to(y=self.scroll_y + len(new), animate=False, immediate=True)
        self.refresh()

    def index_of(self, offset: int) -> int:
        return max(0, bisect.bisect_right(self.offsets, offset) - 1)

    def _to_end(self) -> None:
        """Scroll to the last line, now and once more after the next layout (a view loaded before
        it has its size would otherwise stay at the top)."""
        self.scroll_end(animate=False, immediate=True, x_axis=False)
        self.call_after_refresh(self.scroll_end, animate=False, immediate=True, x_axis=False)

    def show_line(self, index: int) -> None:
        """Mark line `index` current and scroll it a quarter of the way down the view."""
        self.current = index

        def scroll() -> None:
            self.scroll_to(y=max(0, index - self.size.height // 4), animate=False, immediate=True)

        scroll()
        self.call_after_refresh(scroll)
        self.refresh()

    def find(self, pattern: re.Pattern[str], start: int, backward: bool) -> int | None:
        """Index of the nearest loaded line matching `pattern`, from line `start` (inclusive)."""
        indices = range(min(start, len(self.lines) - 1), -1, -1) if backward else range(max(start, 0), len(self.lines))
        return next((i for i in indices if pattern.search(self.lines[i])), None)

    # ---- scrolling: leaving the end stops following; reaching an edge asks for more
    def action_scroll_up(self) -> None:
        self.follow = False
        super().action_scroll_up()

    def action_page_up(self) -> None:
        self.follow = False
        super().action_page_up()

    def action_scroll_home(self) -> None:
        """Jump, not glide: an animated scroll over thousands of lines delays reading the piece above."""
        self.follow = False
        self.scroll_home(animate=False)

    def action_scroll_end(self) -> None:
        self.follow = True
        self._to_end()

    def _on_mouse_scroll_up(self, event: MouseScrollUp) -> None:
        self.follow = False
        super()._on_mouse_scroll_up(event)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if not self.lines:
            return
        if new_value <= 0 < old_value and self.start > 0:
            self.post_message(self.Edge(self, "before"))
        elif new_value >= self.max_scroll_y > old_value and not self.follow:
            self.post_message(self.Edge(self, "after"))

    # ---- rendering
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        base = self.rich_style
        if index >= len(self.lines):
            return Strip.blank(width, base)
        line = self.lines[index]
        text = Text(line[scroll_x : scroll_x + width], no_wrap=True, end="")
        text.stylize(base)  # a span, not Text(style=): Text.render drops the base style of a text without spans
        if ERROR_TEXT.search(line):
            text.stylize(self.get_component_rich_style("log-view--error"))
        if self.highlight is not None:
            match_style = self.get_component_rich_style("log-view--match")
            for m in self.highlight.finditer(line):
                text.stylize(match_style, max(0, m.start() - scroll_x), max(0, m.end() - scroll_x))
        if index == self.current:
            text.stylize(self.get_component_rich_style("log-view--current"))
        return Strip(text.render(self.app.console)).crop_extend(0, width, base)
