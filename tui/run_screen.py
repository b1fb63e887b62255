"""Run: the selected run's charts (loss with the eval loss, learning rate, gradient norm,
tokens/s; a preference run: reward accuracy in place of the learning rate; a run with benchmark
results: their scores there) from metrics.jsonl and benchmarks/ (both read incrementally), its
step, MFU and memory, each rank's health (heartbeats: hung ranks and stragglers marked), its
attempts, and its checkpoints, from which it can be resumed as a new attempt."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.content import Content
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Static

from clusterfsdp.control import doctor, status
from clusterfsdp.control.run import Run
from clusterfsdp.core import health, runfolder
from clusterfsdp.core import spec as specmod
from clusterfsdp.core.errors import describe
from clusterfsdp.core.records import Attempt, RunState
from clusterfsdp.core.term import printable

from . import actions
from .bench_tail import BenchTail
from .byte_sizes import human_size
from .checkpoints import CheckpointRow, scan
from .data_screen import DataScreen
from .eval_samples import EvalSamples
from .latest import deliver
from .metric_chart import MetricChart
from .metrics_tail import EMPTY, Metrics, MetricsTail
from .nav_bar import NavBar
from .rank_health import RankHealthTable
from .resume_screen import ResumeRequest, ResumeScreen
from .run_metrics import DEFAULT_SMOOTHING, SMOOTHING, ChartData, charts
from .status_line import StatusLine

if TYPE_CHECKING:
    from .app import ClusterApp

CHARTS = (
    ("loss", "no loss yet (metrics.jsonl gets a row every train.log_every steps)"),
    ("lr", "no learning rate yet"),
    ("grad_norm", "no gradient norm yet"),
    ("tokens_per_s", "no throughput yet"),
)


@dataclass(frozen=True)
class RunFacts:
    """What the run screen reads from a run folder in one worker pass."""

    attempts: list[Attempt]
    executor: str
    nodes: int
    steps: int | None
    per: str  # what tokens_per_s_per_gpu is per: "GPU", or "rank" for a CPU job
    checkpoints: list[CheckpointRow]
    metrics: Metrics | None  # None: metrics unchanged since the last pass
    ends: dict[str, str] = field(default_factory=dict)  # job id -> how its last incarnation ended (classified)
    diagnosis: doctor.Diagnosis | None = None  # why its newest incarnation failed or hangs (`clusterfsdp doctor`)
    ranks: list[health.RankHealth] = field(default_factory=list)  # the newest attempt's heartbeats
    bench: list[dict[str, Any]] | None = None  # benchmark rows (benchresults.rows); None: unchanged


def progress_text(metrics: Metrics, steps: int | None, per: str, smoothing: float) -> str:
    """The header's second line: where the run is and what it costs."""
    mfu, memory, epoch = metrics.latest("mfu"), metrics.latest("mem_peak_gb"), metrics.latest("epoch")
    return " · ".join(
        [
            f"step {metrics.last_step or 0}/{steps or '?'}",
            *([] if epoch is None else [f"epoch {epoch:.2f}"]),
            f"MFU {'-' if mfu is None else f'{100 * mfu:.1f}%'}",
            f"peak memory {'-' if memory is None else f'{memory:.2f} GB'} per {per}",
            f"smoothing {smoothing:g} (s)",
        ]
    )


class RunScreen(Screen):
    app: ClusterApp  # for the type checker: Textual types self.app as a plain App

    HELP = (
        "The selected run's charts from metrics.jsonl (only new lines are read): loss with the eval "
        "loss on the same axes, learning rate (a preference run: the reward accuracy, with the held-out "
        "one; a run with [benchmarks] results: each benchmark score by checkpoint step, charted as each "
        "result lands), gradient norm and tokens/s, each titled with its latest value. s changes the "
        "smoothing of loss, reward accuracy, gradient norm and tokens/s (TensorBoard's "
        "exponential moving average; the raw values stay, dimmed); tab moves between charts and z "
        "enlarges the focused one. Below: each rank's health while it trains (heartbeat age, step, "
        "step time, how late it reaches the others; hung ranks and stragglers first), the run's "
        "checkpoints (complete ones can be resumed; partial ones are saves that never finished) and "
        "its attempts. Select a complete checkpoint and press enter to resume from it: a new attempt "
        "of the same run, optionally on other nodes or with overrides; newer checkpoints are set "
        "aside, not deleted. With [eval] samples, what the model generated at its newest evaluation "
        "shows above the checkpoints. d shows the samples the run trains on, the trained tokens marked."
    )
    BINDINGS = [
        Binding("R", "resume", "Resume"),
        Binding("s", "smoothing", "Smoothing"),
        Binding("z", "zoom", "Zoom chart"),
        Binding("l", "app.switch_mode('logs')", "Logs"),
        Binding("d", "data", "Data"),
        Binding("q", "app.quit", "Quit"),
    ]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]
    AUTO_FOCUS = "#checkpoints"  # enter resumes from the selected checkpoint

    def __init__(self) -> None:
        super().__init__()
        self.run: runfolder.RunFolder | None = None
        self.tail: MetricsTail | None = None
        self.bench_tail: BenchTail | None = None
        self.facts: RunFacts | None = None
        self.metrics = EMPTY
        self.bench: list[dict[str, Any]] = []  # the run's benchmark rows, oldest step first
        self.smoothing = DEFAULT_SMOOTHING
        self._typed: dict[str, ResumeRequest] = {}  # by run id: a resume that failed, as typed
        self._poller: Timer | None = None
        self._reading = False
        self._next_read = 0.0  # monotonic time before which the 2 s timer does not read again
        self._chart_cost = 0.0

    def compose(self) -> ComposeResult:
        yield NavBar("run")
        yield Static(id="run-header")
        with Grid(id="charts"):
            for key, empty in CHARTS:
                yield MetricChart(empty, id=key)
        yield RankHealthTable(id="ranks")
        yield EvalSamples(id="eval-samples")
        yield DataTable(id="checkpoints", cursor_type="row")
        yield StatusLine()
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
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
        self._show_charts(charts(EMPTY, self.smoothing, "GPU"))
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
            self.bench_tail = BenchTail(run) if run else None
            self._next_read = 0.0
            self.metrics, self.bench = EMPTY, []
            self._show_charts(charts(EMPTY, self.smoothing, "GPU"))
            self.query_one("#checkpoints", DataTable).clear()
            self.query_one(EvalSamples).follow(run.samples_dir if run else None)
        self._show_header()
        self._read()

    def _read(self) -> None:
        if self.run is None or self.tail is None or self.bench_tail is None:
            return
        if self._reading or time.monotonic() < self._next_read:
            return
        self._reading = True
        self._read_facts(self.run, self.tail, self.bench_tail)

    @work(thread=True, group="read", exit_on_error=False)
    def _read_facts(self, run: runfolder.RunFolder, tail: MetricsTail, bench: BenchTail) -> None:
        started = time.monotonic()
        try:
            try:
                spec = run.spec()
                root, nodes = run.checkpoints_dir(spec), spec.node_range.high
                steps = spec.train.steps or status.planned_steps(run)  # train.epochs: as the run counted them
                per = "GPU" if spec.slurm.gpus_per_node else "rank"
            except specmod.SpecError:
                root, nodes, steps, per = run.path / "checkpoints", 1, None, "rank"
            metrics = tail.snapshot() if tail.read_new() else None
            scores = bench.rows() if bench.read_new() else None
            record = run.record()
            events = run.events()
            ends = {e.job_id: e.label for e in status.judged_ends(run, events)}
            found = doctor.diagnose(run, events)
            ranks = health.rank_health(run.path, events, time.time())
            facts = RunFacts(record.attempts, record.executor, nodes, steps, per, scan(root), metrics, ends, found,
                             ranks, scores)  # fmt: skip
        finally:
            self.app.call_from_thread(self._read_done, time.monotonic() - started)
        self.app.call_from_thread(self._show_facts, run, facts)

    def _read_done(self, cost: float) -> None:
        """A long metrics.jsonl makes each pass cost more: wait 9× what the last reading and
        charting cost, so following a run never takes more than a tenth of a core."""
        self._reading = False
        self._next_read = time.monotonic() + 9 * (cost + self._chart_cost)

    def _show_facts(self, run: runfolder.RunFolder, facts: RunFacts) -> None:
        if run != self.run:
            return
        old = self.facts
        self.facts = facts
        if facts.metrics is not None:
            self.metrics = facts.metrics
        if facts.bench is not None:
            self.bench = facts.bench
        if facts.metrics is not None or facts.bench is not None or old is None or old.per != facts.per:
            self._redraw()
        if old is None or old.checkpoints != facts.checkpoints:
            self._show_checkpoints(facts.checkpoints)
        self.query_one("#ranks", RankHealthTable).show(facts.ranks)
        self._show_header()

    def _redraw(self) -> None:
        self._chart(self.metrics, self.smoothing, self._per, self.bench)

    @work(thread=True, exclusive=True, group="charts", exit_on_error=False)
    def _chart(self, metrics: Metrics, smoothing: float, per: str, bench: list[dict[str, Any]]) -> None:
        """Series, smoothing and decimation over every point: O(points), so in a worker."""
        started = time.monotonic()
        data = charts(metrics, smoothing, per, bench)
        deliver(self.app, self._charted, (metrics, bench), smoothing, data, time.monotonic() - started)

    def _charted(self, drawn: tuple[Metrics, list], smoothing: float, data: list[ChartData], cost: float) -> None:
        self._chart_cost = cost
        metrics, bench = drawn
        if metrics is self.metrics and bench is self.bench and smoothing == self.smoothing:  # else a newer one comes
            self._show_charts(data)

    def _show_charts(self, data: list[ChartData]) -> None:
        for chart in data:
            widget = self.query_one(f"#{chart.key}", MetricChart)
            widget.border_title = chart.title
            widget.series = chart.series

    @property
    def _per(self) -> str:
        return self.facts.per if self.facts else "GPU"

    def action_smoothing(self) -> None:
        self.smoothing = SMOOTHING[(SMOOTHING.index(self.smoothing) + 1) % len(SMOOTHING)]
        self._redraw()
        self._show_header()

    def action_zoom(self) -> None:
        """Enlarge the focused chart to the whole screen, or put it back (as W&B expands a panel)."""
        if self.maximized is not None:
            self.minimize()
            return
        chart = self.focused if isinstance(self.focused, MetricChart) else self.query_one("#loss", MetricChart)
        chart.focus()
        self.maximize(chart, container=False)

    def _show_checkpoints(self, rows: list[CheckpointRow]) -> None:
        table = self.query_one("#checkpoints", DataTable)
        selected = table.cursor_row
        table.clear()
        for row in rows:
            saved = time.strftime("%Y-%m-%d %H:%M", time.localtime(row.saved))
            state = {"complete": "complete", "partial": "unfinished save", "set aside": "set aside"}[row.state]
            table.add_row(str(row.step), state, saved, human_size(row.size), row.path.name, key=str(row.path))
        if rows:
            table.move_cursor(row=min(selected, len(rows) - 1))

    def _show_header(self, _: object = None) -> None:
        header = self.query_one("#run-header", Static)
        table = self.query_one("#checkpoints", DataTable)
        if self.run is None:
            header.update(
                "No run selected: pick one in the Queue (2)."
                if self.app.current_row is None
                else "This Slurm job has no run folder: nothing to show here."
            )
            table.border_subtitle = ""
            return
        row = self.app.current_row
        state = f"{row.state}{' - ' + row.reason if row.reason else ''}" if row else "…"
        facts = self.facts
        progress = progress_text(self.metrics, facts.steps if facts else None, self._per, self.smoothing)
        found = facts.diagnosis if facts else None
        shown_why = (
            found is not None
            and row is not None
            and (RunState.parse(row.state).bad or found.finding is doctor.Finding.HANG)
        )
        why = "\n".join(found.render(short=True)) if found is not None and shown_why else ""
        header.update(
            Content.from_markup(
                "[b]$id[/] ($name)  $state\n$progress" + ("\n$why" if why else ""),
                id=printable(self.run.id, lines=False),
                name=printable(self.run.name, lines=False),
                state=printable(state),
                progress=progress,
                why=why,
            )
        )
        header.styles.height = "auto" if why else 2
        attempts, ends = (facts.attempts, facts.ends) if facts else ([], {})
        ended = {job: f" -> {label}" for job, label in ends.items()}
        shown = [f"#{a.attempt} {a.executor}:{a.job_id} ({a.reason}){ended.get(a.job_id, '')}" for a in attempts]
        table.border_subtitle = printable("attempts: " + (", ".join(shown) or "none"), lines=False)

    def action_data(self) -> None:
        """The run's training samples (DataScreen), read through its own job.toml."""
        if self.run is None:
            self.app.notify("no run selected", severity="warning")
            return
        try:
            sources = len(self.run.spec().data.sources)
        except specmod.SpecError:
            sources = 0
        self.app.push_screen(DataScreen(self.run.job_toml, sources))

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

        typed = self._typed.get(run.id)
        self.app.push_screen(ResumeScreen(run, row.step, self.facts.nodes, executor, typed), chosen)

    @work(thread=True, group="resume", exit_on_error=False)
    def _resume(self, run: runfolder.RunFolder, request: ResumeRequest) -> None:
        try:
            sub = actions.resume(Run(run), request.step, request.overrides, request.executor)
        except Exception as e:
            self.app.call_from_thread(self._resumed, run, request, f"resume failed: {describe(e)}", "error")
            return
        text = f"run {run.id}: attempt {sub.job_id} resumes from step {sub.resume_step}"
        self.app.call_from_thread(self._resumed, run, None, text, "information")

    def _resumed(
        self, run: runfolder.RunFolder, failed: ResumeRequest | None, text: str, severity: SeverityLevel
    ) -> None:
        """`failed`: the request that did not go through, kept so R reopens the dialog with it."""
        self.app.activity = ""
        if failed is not None:
            self._typed[run.id] = failed
            text += " (R reopens the dialog with what you typed)"
        else:
            self._typed.pop(run.id, None)
        self.app.notify(text, severity=severity, timeout=10 if severity == "error" else 5)
        self.app.refresh_queue(now=True)
        self._read()
