"""Queue: every run under the run root and the user's other Slurm jobs, refreshed in the
background. Rows are keyed by run folder (or job id), so the selection and the scroll position
stay put across refreshes and resumes. Below 100 columns the JOB and TRIES columns move to the
detail lines and REASON takes the width that is left (cut with … there, whole in the detail)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from clusterfsdp.core.errors import describe
from clusterfsdp.core.term import printable

from .actions import cancel, remove
from .compose_screen import ComposeScreen
from .confirm_screen import ConfirmScreen
from .nav_bar import NavBar
from .queue_rows import QueueRow
from .shown_paths import shown
from .status_line import StatusLine

if TYPE_CHECKING:
    from .app import ClusterApp

COLUMNS = (
    ("run", "RUN"),
    ("name", "NAME"),
    ("state", "STATE"),
    ("step", "STEP"),
    ("loss", "LOSS"),
    ("cost", "COST"),
    ("job", "JOB"),
    ("tries", "TRIES"),
    ("reason", "REASON"),
)
NARROW = ("run", "name", "state", "step", "loss", "reason")  # below NARROW_BELOW columns
NARROW_BELOW = 100
STATE_STYLE = {
    "RUNNING": "bold green",
    "COMPLETING": "green",
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
    "UNREADABLE": "bold magenta",
}


def cells(row: QueueRow) -> dict[str, str | Text]:
    """The row's cells, each one line of printable text (`term.printable`: a folder name or a
    reason from a planted run never drives the terminal)."""
    return {
        "run": row.label if row.run else "-",
        "name": printable(row.name, lines=False),
        "state": Text(printable(row.state, lines=False), style=STATE_STYLE.get(row.state, "")),
        "step": printable(row.step, lines=False) or "-",
        "loss": row.loss or "-",
        "cost": row.cost or "-",
        "job": printable(row.job, lines=False),
        "tries": str(row.attempts),
        "reason": printable(row.reason, lines=False),
    }


def widths(rows: list[dict[str, str | Text]], columns: tuple[str, ...], width: int) -> dict[str, int]:
    """Each column's width: its widest cell, except REASON, which gets at most what the others
    leave of the screen (one space either side of each column, 2 for the scroll bar) and has its
    longer cells cut with … (the detail lines show them whole)."""
    labels = dict(COLUMNS)
    out = {c: max([len(labels[c]), *(len(str(r[c])) for r in rows)]) for c in columns}
    if width > 0:  # 0: not laid out yet; the resize that follows fits them
        room = width - sum(out[c] + 2 for c in columns if c != "reason") - 2
        out["reason"] = max(len(labels["reason"]), min(out["reason"], room))
    for r in rows:
        reason = str(r["reason"])
        if len(reason) > out["reason"]:
            r["reason"] = reason[: out["reason"] - 1] + "…"
    return out


class QueueScreen(Screen):
    app: ClusterApp  # for the type checker: Textual types self.app as a plain App

    HELP = (
        "Runs under the run root (newest first) and your other Slurm jobs. The list refreshes in the "
        "background with one squeue call (plus sacct for runs that left the queue and for what runs "
        "cost, squeue --start for when waiting runs start, and sinfo for the Cluster screen); finished runs "
        "stay, read from their folders. COST: GPU-hours (CPU-hours without GPUs) from Slurm's accounting, "
        "? when sacct cannot tell. A waiting run's detail says why it waits and when Slurm expects it "
        "to start. Select a row to make it the run that Logs and Run show."
    )
    BINDINGS = [
        Binding("r", "app.refresh_queue", "Refresh"),
        Binding("c", "cancel", "Cancel"),
        Binding("delete,x", "remove", "Remove run"),
        Binding("l", "open('logs')", "Logs"),
        Binding("m", "open('run')", "Metrics"),
        Binding("e", "edit", "Copy job"),
        Binding("n", "app.switch_mode('compose')", "New"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._keys: list[str] = []
        self._shown: dict[str, dict[str, str | Text]] = {}
        self._layout: tuple[tuple[str, int], ...] = ()  # the columns shown and their widths

    def compose(self) -> ComposeResult:
        yield NavBar("queue")
        yield DataTable(id="queue", cursor_type="row", zebra_stripes=True)
        yield Static(id="queue-detail", markup=False)
        yield StatusLine()
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self.watch(self.app, "rows", self._show_rows)

    def on_resize(self) -> None:
        self._show_rows(self.app.rows)

    def _show_rows(self, rows: list[QueueRow]) -> None:
        table = self.query_one(DataTable)
        columns = NARROW if 0 < self.size.width < NARROW_BELOW else tuple(key for key, _ in COLUMNS)
        shown = {row.key: cells(row) for row in rows}
        layout = tuple(widths(list(shown.values()), columns, self.size.width).items())
        if layout != self._layout:  # fixed widths: a cell rendered before the table measures is never cut
            table.clear(columns=True)
            labels = dict(COLUMNS)
            for key, width in layout:
                table.add_column(labels[key], key=key, width=width)
            self._layout, self._keys = layout, []
        keys = [r.key for r in rows]
        if keys == self._keys:  # same rows: update changed cells in place
            for key, new in shown.items():
                for column in columns:
                    if str(self._shown[key][column]) != str(new[column]):
                        table.update_cell(key, column, new[column])
                self._shown[key] = new
        else:  # rows came or went: rebuild, then put the selected row back where it was on screen
            selected, scroll_y = self.app.current_key, table.scroll_y
            was = self._keys.index(selected) if selected in self._keys else None
            table.clear()
            self._shown = shown
            for key in keys:
                table.add_row(*(shown[key][c] for c in columns), key=key)
            self._keys = keys
            if selected in keys:
                now = keys.index(selected)
                table.move_cursor(row=now, scroll=False)
                target = scroll_y + now - (now if was is None else was)
                table.call_after_refresh(table.scroll_to, y=target, animate=False, immediate=True)
        self._show_detail()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is None:  # an empty table: Up, PageDown... highlight no row
            return
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
        tries = f"{row.attempts} attempt{'s' if row.attempts != 1 else ''}"
        spent = f" · cost {row.spent}" if row.spent else ""  # (the detail is 3 lines: facts join theirs)
        expected = f"expected to start {row.expected} (Slurm's estimate) · " if row.expected else ""
        detail.update(
            Content.from_markup(
                "[b]$label[/]  $state  $job · $tries$spent\n$where\n$expected$reason",
                label=row.label,
                state=printable(row.state, lines=False),
                job=printable(row.job, lines=False),
                tries=tries,
                spent=printable(spent, lines=False),
                where=printable(where, lines=False),
                reason=printable(row.reason or ""),
                expected=printable(expected, lines=False),
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
        confirm = ConfirmScreen("Cancel job", question, yes="Cancel job")
        self._ask_then(confirm, f"cancelling {row.label}…", "cancel", lambda: cancel(row, self.app.slurm))

    def action_remove(self) -> None:
        """Delete the selected run's folder and checkpoints, as `clusterfsdp rm` does (the run
        service refuses a live run and another user's)."""
        row = self.app.current_row
        if row is None:
            return
        if row.run is None:
            self.app.notify("only runs can be removed: this Slurm job has no run folder", severity="warning")
            return
        question = (f"Remove run {row.label} ({row.state})?\nIts folder {shown(row.run.path)} and its checkpoints "
                    "are deleted; this cannot be undone. A live run is refused: cancel it first.")  # fmt: skip
        confirm = ConfirmScreen("Remove run", question, yes="Remove run")
        self._ask_then(confirm, f"removing {row.label}…", "remove", lambda: remove(row))

    def _ask_then(self, confirm: ConfirmScreen, activity: str, verb: str, act: Callable[[], str]) -> None:
        """Ask first; on yes, run `act` (a blocking call into the run service) in a worker thread
        and show what it says, or why it failed, as a notification."""

        def answered(yes: bool | None) -> None:
            if yes:
                self.app.activity = activity
                self.run_worker(lambda: self._act_blocking(verb, act), thread=True, group=verb, exit_on_error=False)

        self.app.push_screen(confirm, answered)

    def _act_blocking(self, verb: str, act: Callable[[], str]) -> None:
        severity: SeverityLevel
        try:
            text, severity = act(), "information"
        except Exception as e:
            text, severity = f"{verb} failed: {describe(e)}", "error"
        self.app.call_from_thread(self._acted, text, severity)

    def _acted(self, text: str, severity: SeverityLevel) -> None:
        self.app.activity = ""
        self.app.notify(text, severity=severity)
        self.app.refresh_queue(now=True)
