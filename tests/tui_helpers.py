"""Helpers for the TUI tests: a fake Slurm, run folders with fixed content, and pilot loops.

The fake Slurm stands in for squeue/sacct/sinfo/scancel so queue tests and snapshots do not
depend on whether the dev cluster happens to be up; the `slurm`-marked tests use the real one.
Its sinfo answer is text in sinfo's own output format, read by the real parser.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

from textual.pilot import Pilot

from clusterfsdp.control import cost, partitions
from clusterfsdp.core import runfolder, slurmcli
from clusterfsdp.core import spec as S
from clusterfsdp.core.records import Attempt, Event, EventKind, Executor, RunRecord
from clusterfsdp.tui.app import ClusterApp
from clusterfsdp.tui.queue_rows import QueuedJob, SlurmCommands

SIZE = (120, 36)
SMALL = (80, 24)
# `sinfo -h -O <partitions.SINFO_FORMAT>` as Slurm 22.05 prints it for a small GPU cluster: groups
# of nodes by partition, state, GRES and GRES in use (GPU indices in use, sockets of the GRES).
SINFO = """\
gpu*|up|2-00:00:00|2|idle|0/128/0/128|gpu:h100:8(S:0-1)|gpu:h100:0(IDX:N/A)
gpu*|up|2-00:00:00|1|mixed|32/32/0/64|gpu:h100:8(S:0-1)|gpu:h100:3(IDX:0-2)
gpu*|up|2-00:00:00|4|allocated|256/0/0/256|gpu:h100:8(S:0-1)|gpu:h100:8(IDX:0-7)
gpu*|up|2-00:00:00|1|drained*|0/0/64/64|gpu:h100:8(S:0-1)|gpu:h100:0(IDX:N/A)
cpu|up|1-00:00:00|6|idle|0/384/0/384|(null)|(null)
debug|down|30:00|2|idle~|0/16/0/16|(null)|(null)
"""
T0 = 1_767_268_800.0  # 2026-01-01 12:00:00 UTC: fixed times make snapshots reproducible


class FakeSlurm(SlurmCommands):
    """A cluster in memory: `jobs` is what squeue shows, `finished` what sacct knows, `used` what
    sacct accounts (each incarnation's GPU- and CPU-seconds) and `starts` squeue --start's estimates."""

    def __init__(
        self,
        jobs: dict[str, QueuedJob] | None = None,
        finished: dict[str, slurmcli.JobRow] | None = None,
        error: str = "",
        available: bool = False,
        delay: float = 0.0,
        sinfo: str = "",
        sinfo_error: str = "",
        used: dict[str, cost.Accounted] | None = None,
        starts: dict[str, str] | None = None,
    ):
        self.jobs, self.finished = dict(jobs or {}), dict(finished or {})
        self.used, self.starts = dict(used or {}), dict(starts or {})
        self.error, self._available, self.delay = error, available, delay
        self.sinfo, self.sinfo_error = sinfo, sinfo_error
        self.calls: Counter[str] = Counter()
        self.sacct_ids: list[list[str]] = []
        self.cancelled: list[str] = []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()

    def available(self) -> bool:
        self.calls["available"] += 1
        return self._available

    def set_available(self, available: bool) -> None:
        self._available = available

    def queue(self) -> dict[str, QueuedJob]:
        with self._lock:
            self.calls["squeue"] += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            time.sleep(self.delay)
            if self.error:
                raise slurmcli.SlurmError(self.error)
            return dict(self.jobs)
        finally:
            with self._lock:
                self.in_flight -= 1

    def accounting(self, job_ids: list[str]) -> dict[str, slurmcli.JobRow]:
        self.calls["sacct"] += 1
        self.sacct_ids.append(list(job_ids))
        return {j: self.finished[j] for j in job_ids if j in self.finished}

    def usage(self, job_ids) -> dict[str, cost.Accounted]:
        self.calls["sacct-usage"] += 1
        return {j: self.used[j] for j in job_ids if j in self.used}

    def expected_starts(self, job_ids: list[str]) -> dict[str, str]:
        self.calls["squeue-start"] += 1
        return {j: self.starts[j] for j in job_ids if j in self.starts}

    def partitions(self) -> list[partitions.Partition]:
        self.calls["sinfo"] += 1
        if self.sinfo_error:
            raise slurmcli.SlurmError(self.sinfo_error)
        return partitions.parse(self.sinfo)

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)
        self.jobs.pop(job_id, None)


def job(job_id: str, state: str = "RUNNING", name: str = "other", reason: str = "None") -> QueuedJob:
    return QueuedJob(slurmcli.JobRow(job_id, state, reason, "1:02", "node1"), name, "debug")


def make_run(
    root: Path,
    run_id: str = "20260101-120000-aaaa",
    *,
    name: str = "tiny-cpu",
    executor: str = "local",
    job_id: str = "1001",
    steps: int = 40,
    logged: int = 40,
    end: str | None = "completed",
    log_lines: int = 30,
    ranks: int = 2,
    checkpoints: tuple[int, ...] = (20, 40),
    partial: tuple[int, ...] = (),
    gpus_per_node: int = 0,
    eval_every: int = 0,
) -> runfolder.RunFolder:
    """A run folder as the worker leaves it, with fixed times and contents (no training).
    With `eval_every`, eval rows (eval keys only, as the worker logs them) follow those steps."""
    slurm = f"gpus_per_node = {gpus_per_node}" if gpus_per_node else f"tasks_per_node = {ranks}"
    precision = "" if gpus_per_node else '[fsdp]\nmixed_precision = "fp32"\n'
    spec = S.loads(
        f'[job]\nname = "{name}"\nrun_root = "{root}"\n[slurm]\n{slurm}\n'
        f"[train]\nsteps = {steps}\nlog_every = 10\n{precision}"
        f"[checkpoint]\nevery_steps = 20\n"
    )
    run = runfolder.RunFolder(root / name / run_id)
    for sub in ("submitit", "logs", "nodes"):
        (run.path / sub).mkdir(parents=True)
    run.job_toml.write_text(S.dumps(spec, redact=True))
    attempt = Attempt(0, job_id, Executor(executor), T0, "submit")
    run.write_record(RunRecord(run_id, name, Executor(executor), T0, [attempt]))
    events = [Event(EventKind.START, job_id, 0, 0, "node1", T0 + 5)]
    if end:
        events.append(Event(EventKind(end), job_id, 0, 0, "node1", T0 + 60, step=logged))
    for event in events:
        run.append_event(event)
    rows = []
    for step in range(10, logged + 1, 10):
        rows.append(
            {
                "step": step,
                "loss": 5.0 - 2.5 * step / steps,
                "lr": 3e-4,
                "grad_norm": 0.5,
                "tokens_per_s": 20000.0 + 100 * step,
                "tokens_per_s_per_gpu": 10000.0 + 50 * step,
                "mfu": None,
                "mem_peak_gb": 0.42,
                "time": T0 + step,
                "elapsed_s": float(step),
            }
        )
        if eval_every and step % eval_every == 0:
            rows.append({"step": step, "eval_loss": 5.2 - 2.4 * step / steps, "eval_ppl": 10.0})
    run.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for rank in range(ranks):
        log = run.log_path(job_id, 0, rank)
        log.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"[rank{rank}] line {i}: step {i} loss {5 - i / 10:.4f}" for i in range(log_lines)]
        log.write_text("\n".join(lines) + "\n")
    ck_root = run.path / "checkpoints"
    for step in checkpoints:
        folder = ck_root / f"step-{step:08d}"
        folder.mkdir(parents=True)
        (folder / ".metadata").write_bytes(b"m" * 1000)
        (folder / "__0_0.distcp").write_bytes(b"x" * 50_000)
        (folder / "clusterfsdp.json").write_text(json.dumps({"step": step, "saved": T0 + step, "world_size": ranks}))
    for step in partial:
        folder = ck_root / f".step-{step:08d}.partial"
        folder.mkdir(parents=True)
        (folder / "__0_0.distcp").write_bytes(b"x" * 20_000)
        os.utime(folder, (T0 + step, T0 + step))
    return run


def write_bench(run: runfolder.RunFolder, step: int, scores: dict[str, float], lower: tuple[str, ...] = ()) -> None:
    """benchmarks/step-N.json as worker/bench.write leaves it (renamed into place): the flat
    `bench/<task>/<metric>` scores and lm-eval's `higher_is_better` table (false for `lower`)."""
    higher: dict[str, dict[str, bool]] = {}
    for name in scores:
        _, task, metric = name.split("/", 2)
        if not metric.endswith("_stderr"):
            higher.setdefault(task, {})[metric] = name not in lower
    doc = {"step": step, "time": T0 + 100 + step, "seconds": 1.0, "tasks": sorted(higher), "metrics": scores,
           "lm_eval": {"results": {}, "higher_is_better": higher}}  # fmt: skip
    folder = run.path / "benchmarks"
    folder.mkdir(exist_ok=True)
    tmp = folder / f".step-{step}.json.tmp"
    tmp.write_text(json.dumps(doc) + "\n")
    tmp.replace(folder / f"step-{step}.json")


def scored_sweep(root: Path) -> None:
    """Three points as the worker and `bench` leave them (fixed content, no training): point 0
    scored acc 0.5 (word_perplexity 12, better lower) at steps 20 and 40, point 1 acc 0.75 (20) at
    step 40, point 2 no result."""
    from clusterfsdp.control.sweepfolder import SweepFolder
    from clusterfsdp.core.records import SweepPoint, SweepRecord

    points = [SweepPoint(i, f"ab-p{i}", {"train.lr": lr}) for i, lr in enumerate((3e-3, 1e-3, 2e-3))]
    runs = [make_run(root, p.run_id, name="tiny-swab", log_lines=0, checkpoints=()) for p in points]
    lower = ("bench/mc/word_perplexity",)
    write_bench(runs[0], 20, {"bench/mc/acc": 0.9, "bench/mc/word_perplexity": 1.0}, lower)
    for run, acc, ppl in ((runs[0], 0.5, 12.0), (runs[1], 0.75, 20.0)):
        write_bench(run, 40, {"bench/mc/acc": acc, "bench/mc/acc_stderr": 0.1, "bench/mc/word_perplexity": ppl}, lower)
    SweepFolder(root / "tiny-swab").write_record(SweepRecord("swab", "tiny", Executor.LOCAL, T0, ["train.lr"], points))


def run_app(app: ClusterApp, scenario: Callable[[Pilot], Awaitable[None]], size: tuple[int, int] = SIZE) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await scenario(pilot)

    asyncio.run(main())


async def until(pilot: Pilot, condition: Callable[[], object], what: str, timeout: float = 120.0) -> None:
    """Let the app run until `condition()` holds (a hang guard, not a timing assertion: 30 s was
    too short for the Data view's reader subprocess, which imports transformers, in a clean-clone
    CI run beside three other test sessions on 2 cores)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            app = pilot.app
            said = [str(n.message) for n in app._notifications]
            raise AssertionError(f"timed out waiting for {what} (screen {type(app.screen).__name__}, notified {said})")
        await pilot.pause(0.05)


async def select(pilot: Pilot, app: ClusterApp, key: str) -> None:
    """Move the queue's cursor to the row `key`, as the arrow keys do. Setting `app.current_key`
    directly races the table's own first highlight (row 0), which can arrive later under load."""
    from textual.widgets import DataTable

    await until(pilot, lambda: app.current_key is not None, "the first row highlighted")
    table = app.screen.query_one(DataTable)
    table.move_cursor(row=[r.key for r in app.rows].index(key))
    await until(pilot, lambda: app.current_key == key, f"row {key} selected")


async def open_run_screen(pilot: Pilot, app: ClusterApp):
    """Once the queue has selected a run, its run screen (key 4)."""
    from clusterfsdp.tui.run_screen import RunScreen

    await until(pilot, lambda: app.current_key is not None, "a selected run")
    await pilot.press("4")
    screen = app.screen
    assert isinstance(screen, RunScreen)
    return screen


async def open_in_compose(pilot: Pilot, app: ClusterApp, job: Path):
    """Compose (key 1) with a job file opened into it and its review done."""
    from clusterfsdp.tui.compose_screen import ComposeScreen

    await pilot.press("1")
    screen = app.screen
    assert isinstance(screen, ComposeScreen)
    screen.open_file(job)
    await settle(pilot)
    await settle(pilot)  # the review the opening queued
    return screen


async def settle(pilot: Pilot) -> None:
    """Wait for every worker started so far and the messages they posted. A worker cancelled by a
    newer one of its exclusive group (the compose form's review, re-run on each change) is done."""
    from textual.worker import WorkerCancelled

    for worker in list(pilot.app.workers):
        try:
            await worker.wait()
        except WorkerCancelled:
            pass
    await pilot.pause()


async def dialog_text(pilot: Pilot, screen: type, what: str) -> str:
    """The text of the modal `screen`'s `.dialog` once it is up and drawn. A screen is pushed
    before the compositor has drawn it: read at once, its region is still empty (under load the
    first frame came after the read, and the read was "")."""
    app = pilot.app

    def drawn() -> str:
        if not isinstance(app.screen, screen):
            return ""
        return rendered(app.screen.query_one(".dialog")).strip()

    await until(pilot, drawn, what)
    return rendered(app.screen.query_one(".dialog"))


def rendered(widget) -> str:
    """The text on screen inside a widget's region, as a person sees it (children included)."""
    strips = widget.screen._compositor.render_strips()
    r = widget.region
    return "\n".join(strip.crop(r.x, r.x + r.width).text for strip in strips[r.y : r.y + r.height])
