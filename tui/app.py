"""The clusterfsdp TUI: compose a job, watch the queue, tail logs, follow metrics, resume, and
see what the cluster has free.

The app owns what several screens share: the queue rows and the partitions (refreshed here, one
refresh at a time), the selected run, and the Slurm status line. Each screen is a mode with its own stack,
so switching screens keeps each one's state (scroll, selection, search).
"""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.reactive import var

from clusterfsdp.control.partitions import Partition
from clusterfsdp.core import runfolder
from clusterfsdp.core.errors import describe

from .cluster_screen import ClusterScreen
from .compose_screen import ComposeScreen
from .help_screen import HelpScreen
from .latest import deliver
from .logs_screen import LogsScreen
from .queue_rows import QueueRow, Refresh, SlurmCommands, collect
from .queue_screen import QueueScreen
from .run_screen import RunScreen
from .sweeps_screen import SweepsScreen


class ClusterApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "clusterfsdp"
    MODES = {
        "compose": ComposeScreen,
        "queue": QueueScreen,
        "logs": LogsScreen,
        "run": RunScreen,
        "cluster": ClusterScreen,
        "sweeps": SweepsScreen,
    }
    DEFAULT_MODE = "queue"
    BINDINGS = [
        Binding("1", "switch_mode('compose')", "Compose", show=False),
        Binding("2", "switch_mode('queue')", "Queue", show=False),
        Binding("3", "switch_mode('logs')", "Logs", show=False),
        Binding("4", "switch_mode('run')", "Run", show=False),
        Binding("5", "switch_mode('cluster')", "Cluster", show=False),
        Binding("6", "switch_mode('sweeps')", "Sweeps", show=False),
        Binding("f1", "help", "Help", priority=True),
        Binding("question_mark", "help", "Help", show=False),
        Binding("ctrl+q", "quit", "Quit", priority=True, show=False),
    ]

    rows: var[list[QueueRow]] = var(list, always_update=True)
    """The queue as of the last refresh: runs newest first, then the user's other Slurm jobs."""
    current_key: var[str | None] = var(None)
    """The selected row's key (a run folder, or 'job:<id>'): what Logs and Run show."""
    current_sweep: var[str | None] = var(None)
    """A sweep folder for the Sweeps screen to select: the sweep Compose submitted last."""
    partitions: var[list[Partition] | None] = var(None)
    """The partitions as of the last refresh (one sinfo call); None while Slurm does not answer."""
    slurm_error = var("")
    cluster_error = var("")
    refreshing = var(False)
    activity = var("")
    """A long action under way (submitting, cancelling), for the status line."""
    slurm_available: var[bool | None] = var(None)
    """Whether a Slurm controller answers (None until the first check has returned)."""

    def __init__(self, run_root: Path, slurm: SlurmCommands | None = None, refresh_s: float = 10.0) -> None:
        super().__init__()
        self.run_root = run_root
        self.slurm = slurm or SlurmCommands()
        self.refresh_s = refresh_s
        self.refreshed = 0  # completed refreshes, so tests and the bench can wait for one
        self._refresh_again = False

    @property
    def current_row(self) -> QueueRow | None:
        return next((r for r in self.rows if r.key == self.current_key), None)

    @property
    def current_run(self) -> runfolder.RunFolder | None:
        row = self.current_row
        if row is not None:
            return row.run
        if self.current_key and not self.current_key.startswith("job:"):
            return runfolder.RunFolder(Path(self.current_key))  # just submitted, not yet in a refresh
        return None

    def on_mount(self) -> None:
        self.set_interval(self.refresh_s, self.refresh_queue)
        self.refresh_queue()
        self.probe_slurm()

    # ---- the queue: one refresh in flight at most
    def refresh_queue(self, now: bool = False) -> None:
        """Start a refresh unless one is running; `now` (the r key, after a submit or cancel)
        queues one more right after a running one, the timer does not."""
        if self.refreshing:
            self._refresh_again = self._refresh_again or now
            return
        self.refreshing = True
        self._collect()

    def action_refresh_queue(self) -> None:
        self.refresh_queue(now=True)

    @work(thread=True, group="queue", exit_on_error=False)
    def _collect(self) -> None:
        try:
            refresh = collect(self.run_root, self.slurm)
        except Exception as e:
            self.call_from_thread(self._collected, None, f"reading {self.run_root}: {describe(e)}")
            return
        self.call_from_thread(self._collected, refresh, refresh.error)

    def _collected(self, refresh: Refresh | None, error: str) -> None:
        if refresh is not None:
            self.rows = refresh.rows
            self.partitions, self.cluster_error = refresh.partitions, refresh.cluster_error
        if bool(error) != bool(self.slurm_error) and self.slurm_available is not None:
            self.probe_slurm()  # squeue started or stopped answering: is a controller there now?
        self.slurm_error = error
        self.refreshed += 1
        self.refreshing = False
        if self._refresh_again:
            self._refresh_again = False
            self.refresh_queue()

    @work(thread=True, group="probe", exclusive=True, exit_on_error=False)
    def probe_slurm(self) -> None:
        """Ask again whether a Slurm controller answers (`scontrol ping`): at start, when squeue
        starts or stops answering, and before a submit that depends on it."""
        available = self.slurm.available()
        deliver(self, setattr, self, "slurm_available", available)

    # ---- help
    def action_help(self) -> None:
        screen = self.screen
        if isinstance(screen, HelpScreen):
            return
        keys: dict[str, str] = {}
        for active in screen.active_bindings.values():
            b = active.binding
            own = active.node is screen or active.node is self  # a focused widget's keys only if shown
            if b.description and b.action != "help" and not b.action.startswith("switch_mode") and (own or b.show):
                keys.setdefault(b.description, self.get_key_display(b))
        question_mark = screen.active_bindings.get("question_mark")  # the Logs screen searches upwards with ?
        question_mark_is_help = question_mark is None or question_mark.binding.action == "help"
        rows = [(k, d) for d, k in keys.items()] + [
            ("1 2 3 4 5 6", "Compose, Queue, Logs, Run, Cluster, Sweeps"),
            ("? / F1" if question_mark_is_help else "F1", "this help"),
        ]
        self.push_screen(HelpScreen(type(screen).__name__.removesuffix("Screen"), getattr(screen, "HELP", ""), rows))
