"""Queue: every run under the run root and the user's other Slurm jobs, refreshed in the
background. Rows are keyed by run folder (or job id), so the selection and the scroll position
stay put across refreshes and resumes."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from .actions import cancel
from .compose_screen import ComposeScreen
from .confirm_screen import ConfirmScreen
from .nav_bar import NavBar
from .paths import shown
from .queue_rows import QueueRow
from .status_line import StatusLine

COLUMNS = (
    ("run", "RUN"),
    ("name", "NAME"),
    ("state", "STATE"),
    ("step", "STEP"),
    ("loss", "LOSS"),
    ("job", "JOB"),
    ("tries", "TRIES"),
    ("reason", "REASON"),
)
STATE_STYLE = {
    "RUNNING": "bold green",
    "PENDING": "yellow",
    "CONFIGURING": "yellow",
    "REQUEUED": "yellow",
    "COMPLETED": "green",
    "FAILED": "bold red",
    "NODE_FAIL": "bold red",
    "OUT_OF_MEMORY": "bold red",
    "TIMEOUT": "red",
    "CANCELLED": "dim",
    "PREPARED": "dim",
    "UNKNOWN": "magenta",
}


def cells(row: QueueRow) -> tuple:
    return (
        row.run.id if row.run else "-",
        row.name,
        Text(row.state, style=STATE_STYLE.get(row.state, "")),
        row.step or "-",
        row.loss or "-",
        row.job,
        str(row.attempts),
        row.reason,
    )


class QueueScreen(Screen):
    HELP = (
        "Runs under the run root (newest first) and your other Slurm jobs. The list refreshes in the "
        "background with one squeue call (plus sacct for runs that left the queue); finished runs "
        "stay, read from their folders. Select a row to make it the run that Logs and Run show."
    )
    BINDINGS = [
        Binding("r", "app.refresh_queue", "Refresh"),
        Binding("c", "cancel", "Cancel job"),
        Binding("l", "open('logs')", "Logs"),
        Binding("m", "open('run')", "Metrics"),
        Binding("e", "edit", "Edit job.toml"),
        Binding("n", "app.switch_mode('compose')", "New job"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._keys: list[str] = []
        self._shown: dict[str, tuple] = {}

    def compose(self) -> ComposeResult:
        yield NavBar("queue")
        yield DataTable(id="queue", cursor_type="row", zebra_stripes=True)
        yield Static(id="queue-detail", markup=False)
        yield StatusLine()
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        self.watch(self.app, "rows", self._show_rows)

    def _show_rows(self, rows: list[QueueRow]) -> None:
        table = self.query_one(DataTable)
        keys = [r.key for r in rows]
        if keys == self._keys:  # same rows: update changed cells in place
            for row in rows:
                new = cells(row)
                for (column, _), old_value, value in zip(COLUMNS, self._shown[row.key], new, strict=False):
                    if str(old_value) != str(value):
                        table.update_cell(row.key, column, value)
                self._shown[row.key] = new
        else:  # rows came or went: rebuild, then put the selected row back where it was on screen
            selected, scroll_y = self.app.current_key, table.scroll_y
            was = self._keys.index(selected) if selected in self._keys else None
            table.clear()
            self._shown = {row.key: cells(row) for row in rows}
            for row in rows:
                table.add_row(*self._shown[row.key], key=row.key)
            self._keys = keys
            if selected in keys:
                now = keys.index(selected)
                table.move_cursor(row=now, scroll=False)
                target = scroll_y + now - (now if was is None else was)
                table.call_after_refresh(table.scroll_to, y=target, animate=False, immediate=True)
        self._show_detail()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.app.current_key = event.row_key.value
        self._show_detail()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open("logs")

    def _show_detail(self) -> None:
        row = self.app.current_row
        detail = self.query_one("#queue-detail", Static)
        if row is None:
            detail.update(f"no runs under {shown(self.app.run_root)} yet: n composes one" if not self.app.rows else "")
            return
        where = shown(row.run.path) if row.run else "no run folder (not submitted by clusterfsdp)"
        detail.update(
            Content.from_markup(
                "[b]$label[/]  $state  $where\n$reason",
                label=row.label,
                state=row.state,
                where=where,
                reason=row.reason or "",
            )
        )

    def action_open(self, mode: str) -> None:
        if self.app.current_row is not None:
            self.app.switch_mode(mode)

    async def action_edit(self) -> None:
        """Open the run's job.toml in Compose, as the start of a new job (never saved over the run's)."""
        row = self.app.current_row
        if row is not None and row.run is not None:
            await self.app.switch_mode("compose")
            if isinstance(self.app.screen, ComposeScreen):
                self.app.screen.open_file(row.run.job_toml, template=True)

    def action_cancel(self) -> None:
        row = self.app.current_row
        if row is None:
            return
        question = f"Cancel {row.label} ({row.job}, {row.state})?\n" + (
            "Workers save a checkpoint at the next step boundary, then exit."
            if row.run
            else "This Slurm job has no run folder; scancel stops it."
        )

        def answered(yes: bool | None) -> None:
            if yes:
                self._cancel(row)

        self.app.push_screen(ConfirmScreen("Cancel job", question, yes="Cancel job"), answered)

    def _cancel(self, row: QueueRow) -> None:
        self.app.activity = f"cancelling {row.label}…"
        self.run_worker(lambda: self._cancel_blocking(row), thread=True, group="cancel", exit_on_error=False)

    def _cancel_blocking(self, row: QueueRow) -> None:
        try:
            text, severity = cancel(row, self.app.slurm), "information"
        except Exception as e:
            text, severity = f"cancel failed: {e}", "error"
        self.app.call_from_thread(self._cancelled, text, severity)

    def _cancelled(self, text: str, severity: str) -> None:
        self.app.activity = ""
        self.app.notify(text, severity=severity)
        self.app.refresh_queue(now=True)
