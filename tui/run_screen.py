"""Run: the selected run's loss curve and throughput from metrics.jsonl (read incrementally),
its attempts, and its checkpoints, from which it can be resumed as a new attempt."""

from __future__ import annotations

import time
from dataclasses import dataclass

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Sparkline, Static

from clusterfsdp.control import runfolder
from clusterfsdp.control import spec as specmod
from clusterfsdp.control.records import Attempt
from clusterfsdp.control.run import Run

from . import actions
from .checkpoints import CheckpointRow, scan
from .loss_plot import LossPlot
from .metrics_tail import MetricsTail, Point
from .nav_bar import NavBar
from .resume_screen import ResumeRequest, ResumeScreen
from .status_line import StatusLine
from .units import human_size


@dataclass(frozen=True)
class RunFacts:
    """What the run screen reads from a run folder in one worker pass."""

    attempts: list[Attempt]
    executor: str
    nodes: int
    checkpoints: list[CheckpointRow]
    points: list[Point] | None  # None: metrics unchanged since the last pass


def latest_text(points: list[Point]) -> str:
    if not points:
        return "no metrics yet"
    p = points[-1]

    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    return "\n".join(
        [
            f"step       {p.step}",
            f"loss       {num(p.loss, '.4f')}",
            f"lr         {num(p.lr, '.2e')}",
            f"grad norm  {num(p.grad_norm, '.3f')}",
            f"tokens/s   {num(p.tokens_per_s, ',.0f')}",
            f"  per GPU  {num(p.tokens_per_s_per_gpu, ',.0f')}",
            f"MFU        {'-' if p.mfu is None else f'{100 * p.mfu:.1f}%'}",
            f"memory     {num(p.mem_peak_gb, '.2f')} GB peak",
        ]
    )


class RunScreen(Screen):
    HELP = (
        "The selected run: loss curve and the latest throughput, MFU and memory from metrics.jsonl "
        "(only new lines are read), its attempts, and its checkpoints (complete ones can be resumed; "
        "partial ones are saves that never finished). Select a complete checkpoint and press enter "
        "to resume from it: a new attempt of the same run, optionally on other nodes or with "
        "overrides; newer checkpoints are set aside, not deleted."
    )
    BINDINGS = [
        Binding("R", "resume", "Resume"),
        Binding("l", "app.switch_mode('logs')", "Logs"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.run: runfolder.RunFolder | None = None
        self.tail: MetricsTail | None = None
        self.facts: RunFacts | None = None
        self._poller: Timer | None = None
        self._reading = False

    def compose(self) -> ComposeResult:
        yield NavBar("run")
        yield Static(id="run-header", markup=False)
        with Horizontal(id="run-body"):
            yield LossPlot(id="loss")
            with Vertical(id="run-stats"):
                yield Static(id="latest", markup=False)
                yield Sparkline([], id="tps")
        yield DataTable(id="checkpoints", cursor_type="row")
        yield StatusLine()
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#loss").border_title = "loss"
        self.query_one("#tps").border_title = "tokens/s"
        table = self.query_one("#checkpoints", DataTable)
        table.border_title = "checkpoints"
        for key, label in (
            ("step", "STEP"),
            ("state", "STATE"),
            ("saved", "SAVED"),
            ("size", "SIZE"),
            ("path", "FOLDER"),
        ):
            table.add_column(label, key=key)
        self._poller = self.set_interval(2.0, self._read)
        self.watch(self.app, "current_key", self._run_changed)
        self.watch(self.app, "rows", self._show_header, init=False)

    def on_screen_suspend(self) -> None:
        if self._poller:
            self._poller.pause()

    def on_screen_resume(self) -> None:
        if self._poller:
            self._poller.resume()
        self._run_changed()

    def _run_changed(self, _: object = None) -> None:
        run = self.app.current_run
        if run != self.run:
            self.run, self.tail, self.facts = run, MetricsTail(run.metrics_file) if run else None, None
            self.query_one(LossPlot).points = []
            self.query_one("#checkpoints", DataTable).clear()
        self._show_header()
        self._read()

    def _read(self) -> None:
        if self.run is not None and not self._reading:
            self._reading = True
            self._read_facts(self.run, self.tail)

    @work(thread=True, group="read", exit_on_error=False)
    def _read_facts(self, run: runfolder.RunFolder, tail: MetricsTail) -> None:
        try:
            try:
                spec = run.spec()
                root, nodes = run.checkpoints_dir(spec), spec.slurm.nodes
            except specmod.SpecError:
                root, nodes = run.path / "checkpoints", 1
            changed = tail.read_new()
            record = run.record()
            facts = RunFacts(record.attempts, record.executor, nodes, scan(root), tail.points() if changed else None)
        finally:
            self.app.call_from_thread(setattr, self, "_reading", False)
        self.app.call_from_thread(self._show_facts, run, facts)

    def _show_facts(self, run: runfolder.RunFolder, facts: RunFacts) -> None:
        if run != self.run:
            return
        old = self.facts
        self.facts = facts
        if facts.points is not None:
            self.query_one(LossPlot).points = facts.points
            self.query_one("#latest", Static).update(latest_text(facts.points))
            self.query_one("#tps", Sparkline).data = [p.tokens_per_s or 0 for p in facts.points[-120:]]
        if old is None or old.checkpoints != facts.checkpoints:
            self._show_checkpoints(facts.checkpoints)
        self._show_header()

    def _show_checkpoints(self, rows: list[CheckpointRow]) -> None:
        table = self.query_one("#checkpoints", DataTable)
        selected = table.cursor_row
        table.clear()
        for row in rows:
            saved = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.saved))
            state = {"complete": "complete", "partial": "partial (unfinished save)", "set aside": "set aside"}[
                row.state
            ]
            table.add_row(str(row.step), state, saved, human_size(row.size), row.path.name, key=str(row.path))
        if rows:
            table.move_cursor(row=min(selected, len(rows) - 1))

    def _show_header(self, _: object = None) -> None:
        header = self.query_one("#run-header", Static)
        if self.run is None:
            header.update(
                "No run selected: pick one in the Queue (2)."
                if self.app.current_row is None
                else "This Slurm job has no run folder: nothing to show here."
            )
            return
        row = self.app.current_row
        state = f"{row.state}{' - ' + row.reason if row.reason else ''}" if row else "…"
        attempts = self.facts.attempts if self.facts else []
        tries = "  ".join(f"#{a.attempt} {a.executor}:{a.job_id} ({a.reason})" for a in attempts)
        header.update(
            Content.from_markup(
                "[b]$id[/] ($name)  $state\nattempts: $tries",
                id=self.run.id,
                name=self.run.name,
                state=state,
                tries=tries or "none",
            )
        )

    # ---- resume
    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_resume()

    def action_resume(self) -> None:
        if self.run is None or self.facts is None or not self.facts.checkpoints:
            self.app.notify("no checkpoint to resume from", severity="warning")
            return
        table = self.query_one("#checkpoints", DataTable)
        row = self.facts.checkpoints[min(table.cursor_row, len(self.facts.checkpoints) - 1)]
        if not row.resumable:
            self.app.notify(f"step {row.step} is {row.state}: pick a complete checkpoint", severity="warning")
            return
        run = self.run
        executor = self.facts.executor if self.facts.executor in ("slurm", "local") else "auto"

        def chosen(request: ResumeRequest | None) -> None:
            if request is not None:
                self.app.activity = f"resuming {run.id} from step {request.step}…"
                self._resume(run, request)

        self.app.push_screen(ResumeScreen(run.id, row.step, self.facts.nodes, executor), chosen)

    @work(thread=True, group="resume", exit_on_error=False)
    def _resume(self, run: runfolder.RunFolder, request: ResumeRequest) -> None:
        try:
            sub = actions.resume(Run(run), request.step, request.overrides, request.executor)
            text = f"run {run.id}: attempt {sub.job_id} resumes from step {sub.resume_step}"
            severity = "information"
        except Exception as e:
            text, severity = f"resume failed: {e}", "error"
        self.app.call_from_thread(self._resumed, text, severity)

    def _resumed(self, text: str, severity: str) -> None:
        self.app.activity = ""
        self.app.notify(text, severity=severity, timeout=10 if severity == "error" else 5)
        self.app.refresh_queue(now=True)
        self._read()
