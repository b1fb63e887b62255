"""The top line of every screen: the four screens (click, or press their number) and the run
the Logs and Run screens are about."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

SCREENS = (("compose", "Compose"), ("queue", "Queue"), ("logs", "Logs"), ("run", "Run"))


class NavBar(Static):
    def __init__(self, active: str) -> None:
        super().__init__(classes="nav-bar")
        self.active = active

    def on_mount(self) -> None:
        self.watch(self.app, "current_key", self._update)
        self.watch(self.app, "rows", self._update)

    def _update(self, _: object = None) -> None:
        parts = [Content.from_markup("[b]clusterfsdp[/]  ")]
        for number, (mode, title) in enumerate(SCREENS, 1):
            style = "reverse b" if mode == self.active else "u"
            parts.append(
                Content.from_markup(f"[{style} @click=app.switch_mode('{mode}')] {number} $title [/]  ", title=title)
            )
        row = self.app.current_row
        if row is not None:
            parts.append(Content.from_markup("│ [b]$label[/] $state", label=row.label, state=row.state))
        self.update(Content("").join(parts))
