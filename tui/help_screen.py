"""`?`: what the current screen is for and every key it (and the app) answers to."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]

    def __init__(self, title: str, about: str, keys: list[tuple[str, str]]) -> None:
        super().__init__(classes="help-screen")
        self.title_text, self.about, self.keys = title, about, keys

    def compose(self) -> ComposeResult:
        width = max((len(k) for k, _ in self.keys), default=0)
        # Keys and descriptions are variables, never markup: a key such as "[" would open a tag.
        lines = [f"[b]$k{i}[/]  $d{i}" for i in range(len(self.keys))]
        values = {f"k{i}": f"{key:>{width}}" for i, (key, _) in enumerate(self.keys)}
        values.update({f"d{i}": d for i, (_, d) in enumerate(self.keys)})
        keys = Content.from_markup("\n".join(lines), **values)
        with VerticalScroll(classes="dialog") as box:
            box.border_title = f"Help: {self.title_text}"
            box.border_subtitle = "esc to close"
            yield Static(self.about, classes="about", markup=False)
            yield Static(keys)
