"""Sweeps: every sweep under the run root (points, their states counted, the best loss), and for
the selected one its points as `status SWEEP` shows them (varied values, state, step, loss, eval
loss, the newest benchmark scores; s cycles the sort column) over one chart of the points' loss
curves. Space shows or hides a point's curve; Enter makes the point's run the current run, which
Logs and Run then show.

Refreshed in the background like the Queue (a worker reads the sweep folders and the selected
sweep's metrics through sweep_rows); rows are keyed by folder, so the selection stays put."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from clusterfsdp.control.sweepfolder import SORT_KEYS, bench_names, shown_scores, sort_key
from clusterfsdp.core import spec as specmod
from clusterfsdp.core.errors import describe
from clusterfsdp.core.term import printable

from .latest import deliver
from .nav_bar import NavBar
from .plot import Series
from .queue_screen import STATE_STYLE
from .run_metrics import decimate
from .status_line import StatusLine
from .sweep_chart import SweepChart, tag
from .sweep_rows import collect

if TYPE_CHECKING:
    from .app import ClusterApp
    from .sweep_rows import SweepRow, SweepsRefresh

SWEEP_COLUMNS = ("SWEEP", "NAME", "POINTS", "STATES", "BEST")
POINT_COLUMNS = ("POINT", "RUN")
STATUS_COLUMNS = ("STATE", "STEP", "LOSS", "EVAL_LOSS", "SHOWN")


def _num(value: float | None) -> str:
    return f"{value:.4f}" if value is not None else "-"


def _value(value: Any) -> str:
    return specmod.render_value(value) if value is not None else "-"


class SweepsScreen(Screen):
    app: ClusterApp  # for the type checker: Textual types self.app as a plain App

    HELP = (
        "Sweeps under the run root (newest first) and, for the selected one, its points as "
        "`clusterfsdp status SWEEP` shows them (with [benchmarks], each point's newest scores, "
        "named <task>/<metric>), over one chart of their loss curves (eval loss in "
        "the same colour). s cycles the column the points are sorted by; Space shows or hides the "
        "selected point's curve; Enter makes its run the one Logs and Run show."
    )
    BINDINGS = [
        Binding("s", "sort", "Sort"),
        Binding("space", "toggle", "Show/hide"),
        Binding("r", "refresh", "Refresh"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.refreshed = 0  # completed refreshes, so tests can wait for one
        self.sweeps: list[SweepRow] = []
        self.selected: str | None = None  # the selected sweep's folder
        self.sort = "index"
        self.hidden: set[int] = set()  # points whose curve is hidden
        self._refresh: SweepsRefresh | None = None

    def compose(self) -> ComposeResult:
        yield NavBar("sweeps")
        yield DataTable(id="sweeps", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="sweep-points", cursor_type="row", zebra_stripes=True)
        yield SweepChart("no metrics logged yet", id="sweep-chart")
        yield Static(id="sweeps-detail", markup=False)
        yield StatusLine()
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        table = self.query_one("#sweeps", DataTable)
        for label in SWEEP_COLUMNS:
            table.add_column(label, key=label.lower())
        self.set_interval(self.app.refresh_s, self.action_refresh)
        self.watch(self.app, "current_sweep", self._select, init=False)
        self._select(self.app.current_sweep)

    def _select(self, folder: str | None) -> None:
        """Show `folder`'s points (a sweep just submitted), else what is selected."""
        if folder is not None:
            self.selected, self.hidden = folder, set()
        self.action_refresh()

    @property
    def current(self) -> SweepRow | None:
        return next((s for s in self.sweeps if s.key == self.selected), None)

    # ---- reading, in a worker
    def action_refresh(self) -> None:
        self._collect(self.selected)

    @work(thread=True, group="sweeps", exclusive=True, exit_on_error=False)
    def _collect(self, selected: str | None) -> None:
        try:
            refresh = collect(self.app.run_root, selected)
        except Exception as e:
            deliver(self.app, self._collected, None, f"reading {self.app.run_root}: {describe(e)}")
            return
        deliver(self.app, self._collected, refresh, refresh.error)

    def _collected(self, refresh: SweepsRefresh | None, error: str) -> None:
        if refresh is not None:
            self._refresh, self.sweeps = refresh, refresh.sweeps
            if self.current is None:
                self.selected = self.sweeps[0].key if self.sweeps else None
            self._show_sweeps()
            self._show_points()
        detail = self.query_one("#sweeps-detail", Static)
        text = error or ("" if self.sweeps else f"no sweeps under {self.app.run_root}: `clusterfsdp sweep` starts one")
        detail.update(text)
        detail.display = bool(text)  # no empty line above the status line
        self.refreshed += 1

    # ---- showing
    def _show_sweeps(self) -> None:
        table = self.query_one("#sweeps", DataTable)
        with self.prevent(DataTable.RowHighlighted):  # rebuilding moves the cursor: not a selection
            self._fill_sweeps(table)

    def _fill_sweeps(self, table: DataTable) -> None:
        table.clear()
        for s in self.sweeps:
            if s.record is None or s.summary is None:
                error = Text(printable("UNREADABLE " + s.error, lines=False), "bold magenta")
                table.add_row(printable(s.folder.id, lines=False), "?", "-", error, "-", key=s.key)
                continue
            best, point = _num(s.summary.best), s.summary.best_point
            best += f" (point {point.index})" if point is not None else ""  # which point has it
            names = (printable(s.record.sweep_id, lines=False), printable(s.record.name, lines=False))
            table.add_row(*names, str(len(s.points)), s.summary.counts, best, key=s.key)
        keys = [s.key for s in self.sweeps]
        if self.selected in keys:
            table.move_cursor(row=keys.index(self.selected), scroll=False)

    def sorted_points(self) -> list[Any]:
        sweep = self.current
        return sorted(sweep.points, key=lambda r: sort_key(self.sort, r)) if sweep else []

    def _show_points(self) -> None:
        table = self.query_one("#sweep-points", DataTable)
        with self.prevent(DataTable.RowHighlighted):
            self._fill_points(table)
        self._show_chart()

    def _fill_points(self, table: DataTable) -> None:
        sweep = self.current
        cursor = table.cursor_row
        table.clear(columns=True)
        if sweep is None or sweep.record is None:
            return
        keys = sweep.record.keys
        scores = shown_scores(sweep.points, self.sort)
        sorts = {"POINT": "index", **{k.upper(): k.lower() for k in STATUS_COLUMNS}, **{s: s for s in scores}}
        labels = [*POINT_COLUMNS, *keys, *STATUS_COLUMNS[:-1], *scores, STATUS_COLUMNS[-1]]
        for label in labels:
            shown = sorts.get(label, label) == self.sort
            text = label.removeprefix("bench/") + (" ▲" if shown else "")
            table.add_column(Text(text, "bold" if shown else ""), key=label)
        for r in self.sorted_points():
            st = r.status
            state = str(st.state)
            table.add_row(
                str(r.point.index),
                printable(r.point.run_id, lines=False),
                *(printable(_value(r.point.values.get(k)), lines=False) for k in keys),
                Text(state, STATE_STYLE.get(state, "")),
                f"{st.step or 0}/{st.steps or '?'}",
                _num(st.loss),
                _num(st.eval_loss),
                *(_num(r.bench.scores.get(n) if r.bench else None) for n in scores),
                "●" if r.point.index not in self.hidden else "",
                key=str(r.point.index),
            )
        table.move_cursor(row=min(cursor, max(0, table.row_count - 1)), scroll=False)

    def _show_chart(self) -> None:
        chart = self.query_one(SweepChart)
        sweep, curves = self.current, self._refresh.curves if self._refresh else {}
        series: list[Series] = []
        if sweep is not None:
            for r in sweep.points:
                curve = curves.get(r.point.index)
                if curve is None or r.point.index in self.hidden:
                    continue
                series.append(Series(*decimate(*curve.loss), tag(r.point.index)))
                if curve.eval_loss[0]:
                    series.append(Series(*decimate(*curve.eval_loss), tag(r.point.index)))
        chart.series = series
        shown = [str(r.point.index) for r in self.sorted_points() if r.point.index not in self.hidden]
        chart.border_title = Content.from_markup(
            "[$primary]loss[/] (eval in the same colour)  points $points", points=" ".join(shown) or "none"
        )

    # ---- keys and selection
    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is None or event.data_table.id != "sweeps" or event.row_key.value == self.selected:
            return
        self.selected, self.hidden = event.row_key.value, set()
        self._show_points()
        self.action_refresh()  # the new sweep's curves

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        sweep = self.current
        if event.data_table.id != "sweep-points" or event.row_key.value is None or sweep is None:
            return
        point = next(r.point for r in sweep.points if str(r.point.index) == event.row_key.value)
        self.app.current_key = str(sweep.folder.run_folder(point).path)
        self.app.notify(f"point {point.index}: run {point.run_id} is the current run (4 shows it)")

    def _point_under_cursor(self) -> int | None:
        table = self.query_one("#sweep-points", DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return int(key) if key is not None else None

    def action_toggle(self) -> None:
        index = self._point_under_cursor()
        if index is not None:
            self.hidden ^= {index}
            self._show_points()

    def action_sort(self) -> None:
        sweep = self.current
        if sweep is None or sweep.record is None:
            return

        order = [*SORT_KEYS, *sweep.record.keys, *bench_names(sweep.points, stderr=False)]
        self.sort = order[(order.index(self.sort) + 1) % len(order)] if self.sort in order else order[0]
        self._show_points()
