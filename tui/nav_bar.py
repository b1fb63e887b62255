"""The top line of every screen: the six screens (click, or press their number) and the run
the Logs and Run screens are about."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.content import Content
from textual.widgets import Static

from clusterfsdp.core.term import printable

if TYPE_CHECKING:
    from .app import ClusterApp

SCREENS = (
    ("compose", "Compose"),
    ("queue", "Queue"),
    ("logs", "Logs"),
    ("run", "Run"),
    ("cluster", "Cluster"),
    ("sweeps", "Sweeps"),
)


class NavBar(Static):
    app: ClusterApp  # for the type checker: Textual types self.app as a plain App

    def __init__(self, active: str) -> None:
        super().__init__(classes="nav-bar")
        self.active = active

    def on_mount(self) -> None:
        self.watch(self.app, "current_key", self._update)
        self.watch(self.app, "rows", self._update)

    def on_resize(self) -> None:
        self._update()

    def _update(self, _: object = None) -> None:
        """The screens and the selected run; where that does not fit (80 columns, a run
        selected), the screens other than this one by their number only, so the run's id and
        state still show."""
        row = self.app.current_row
        state = printable(row.state, lines=False) if row else ""
        run = Content.from_markup("│ [b]$label[/] $state", label=row.label, state=state) if row else Content("")
        full = self._screens(titles=True) + run
        fits = not self.content_size.width or full.cell_length <= self.content_size.width
        self.update(full if fits else self._screens(titles=False) + run)

    def _screens(self, titles: bool) -> Content:
        parts = []  # no brand: at 80 columns the selected run's id and state must still fit
        for number, (mode, title) in enumerate(SCREENS, 1):
            click = f"@click=app.switch_mode('{mode}')"
            if mode == self.active:  # the highlight covers the spaces around it
                item = f"[reverse b {click}] {number} $title [/]"
            else:
                item = f" [u {click}]{number}{' $title' if titles else ''}[/] "
            parts.append(Content.from_markup(item, title=title))
        return Content("").join(parts)
