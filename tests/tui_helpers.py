"""Helpers for the TUI tests: a fake Slurm, run folders with fixed content, and pilot loops.

The fake Slurm stands in for squeue/sacct/scancel so queue tests and snapshots do not depend
on whether the dev cluster happens to be up; the `slurm`-marked tests use the real one.
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

from clusterfsdp.control import runfolder, slurmcli
from clusterfsdp.control import spec as S
from clusterfsdp.control.records import Attempt, Event, EventKind, Executor, RunRecord
from clusterfsdp.tui.app import ClusterApp
from clusterfsdp.tui.queue_rows import Slurm, SlurmJob

SIZE = (120, 36)
T0 = 1_767_268_800.0  # 2026-01-01 12:00:00 UTC: fixed times make snapshots reproducible


class FakeSlurm(Slurm):
    """A cluster in memory: `jobs` is what squeue shows, `finished` what sacct knows."""

    def __init__(
        self,
        jobs: dict[str, SlurmJob] | None = None,
        finished: dict[str, slurmcli.JobRow] | None = None,
        error: str = "",
        available: bool = False,
        delay: float = 0.0,
    ):
        self.jobs, self.finished = dict(jobs or {}), dict(finished or {})
        self.error, self._available, self.delay = error, available, delay
        self.calls: Counter[str] = Counter()
        self.sacct_ids: list[list[str]] = []
        self.cancelled: list[str] = []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()

    def available(self) -> bool:
        return self._available

    def queue(self) -> dict[str, SlurmJob]:
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

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)
        self.jobs.pop(job_id, None)


def job(job_id: str, state: str = "RUNNING", name: str = "other", reason: str = "None") -> SlurmJob:
    return SlurmJob(slurmcli.JobRow(job_id, state, reason, "1:02", "node1"), name, "debug")


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
) -> runfolder.RunFolder:
    """A run folder as the worker leaves it, with fixed times and contents (no training)."""
    spec = S.loads(
        f'[job]\nname = "{name}"\nrun_root = "{root}"\n[slurm]\ntasks_per_node = {ranks}\n'
        f'[train]\nsteps = {steps}\nlog_every = 10\n[fsdp]\nmixed_precision = "fp32"\n'
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


def run_app(app: ClusterApp, scenario: Callable[[Pilot], Awaitable[None]], size: tuple[int, int] = SIZE) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await scenario(pilot)

    asyncio.run(main())


async def until(pilot: Pilot, condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Let the app run until `condition()` holds (a hang guard, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def settle(pilot: Pilot) -> None:
    """Wait for every worker started so far and the messages they posted."""
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def rendered(widget) -> str:
    """The text on screen inside a widget's region, as a person sees it (children included)."""
    strips = widget.screen._compositor.render_strips()
    r = widget.region
    return "\n".join(strip.crop(r.x, r.x + r.width).text for strip in strips[r.y : r.y + r.height])
