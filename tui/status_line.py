"""The bottom status line: what the app is doing in the background, and whether Slurm answers.
Slurm being down or missing is shown here, never as a crash or a modal."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.content import Content
from textual.widgets import Static

if TYPE_CHECKING:
    from .app import ClusterApp


class StatusLine(Static):
    app: ClusterApp  # for the type checker: Textual types self.app as a plain App

    def __init__(self) -> None:
        super().__init__(classes="status-line")

    def on_mount(self) -> None:
        for name in ("rows", "slurm_error", "activity", "refreshing"):
            self.watch(self.app, name, self._update)

    def _update(self, _: object = None) -> None:
        app = self.app
        runs = sum(1 for r in app.rows if r.run is not None)
        jobs = len(app.rows) - runs
        queue = "refreshing…" if app.refreshing else f"{runs} runs, {jobs} other Slurm jobs"
        slurm = "[$error]Slurm: $slurm[/]" if app.slurm_error else "Slurm: ok"
        activity = "[b]$activity[/] │ " if app.activity else ""
        self.update(
            Content.from_markup(
                f"{activity}queue: $queue (every $every s, r: now) │ {slurm}",
                activity=app.activity,
                queue=queue,
                every=f"{app.refresh_s:g}",
                slurm=app.slurm_error,
            )
        )
