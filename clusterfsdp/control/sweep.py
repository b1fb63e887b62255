"""Sweeps: many runs of one job as one experiment (`clusterfsdp sweep`, `clusterfsdp.sweep(...)`).

Every point is a normal run made by the run service (`control.run.Run`): its own run folder, its
own job.toml with the point's values in place, its attempts, preemption, requeue, automatic
recovery, resume, cancel and export, exactly as a run of `submit`. The sweep only groups them:

    <run_root>/<job.name>-<sweep id>/        the sweep folder (control.sweepfolder)
        sweep.json                           SweepRecord: the varied keys, the points, the array
        <sweep id>-p<i>/                     point i's run folder (docs/run-folder.md)

so `runs`, `status RUN`, the TUI and trackers see each point as a run (W&B groups them by
job.name, TensorBoard's parent folder is the sweep folder). Every point is checked as a run
(spec, sources, data) before any folder is made: one bad point refuses the whole sweep, named.

- Slurm: ONE job array (`--array=0-K%N`, `launch.queue_array`), held until every point recorded
  its attempt `<array id>_<i>`; task i's job steps and worker find point i's run folder by
  $SLURM_ARRAY_TASK_ID. What happens to a point afterwards (requeue, a follow-up job) is the
  point's own, as for any run.
- Local: a driver process (`python -m clusterfsdp.control.sweep drive SWEEP_DIR`, in its own
  session) starts the points in turn, `max_parallel` at a time, each as a local run
  (`Run.start_first`), and starts none after `cancel`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..core import modelsource, procs, retrynotes, runfolder, slurmcli
from ..core import spec as specmod
from ..core.errors import UserError
from ..core.records import Executor, RunState, SweepPoint, SweepRecord
from ..core.spec.schema import SweepSection
from ..core.value import value
from . import arraylaunch, backends, launch, refjob
from .run import Run, RunError
from .sweepfolder import PointStatus, SweepFolder, find_sweep
from .sweepplan import Point, SweepError, at_point, vary

DRIVER_POLL_S = 1.0


@value(frozen=True)
class Planned:
    """A sweep checked point by point as runs (specs, sources, data), nothing made yet
    (`Sweep.plan`; a dry run stops here); `submit` makes it."""

    sweep_id: str
    name: str  # the job's name
    keys: list[str]
    points: list[Point]
    prepared: list[modelsource.Prepared]
    max_parallel: int
    backend: backends.Backend
    notice: str


class Sweep:
    """One sweep and what may be done with its points (through the run service)."""

    def __init__(self, folder: SweepFolder | Path | str):
        self.folder = folder if isinstance(folder, SweepFolder) else SweepFolder(Path(folder))

    def __repr__(self) -> str:
        return f"Sweep({str(self.folder.path)!r})"

    @property
    def id(self) -> str:
        return self.folder.id

    @property
    def path(self) -> Path:
        return self.folder.path

    def record(self) -> SweepRecord:
        return self.folder.record()

    def runs(self) -> list[Run]:
        return [Run(self.folder.run_folder(p)) for p in self.record().points]

    def statuses(self) -> tuple[list[PointStatus], str]:
        """Every point's status (one squeue + sacct for all), and Slurm's error if it did not answer."""
        return self.folder.statuses()

    @classmethod
    def find(cls, ref: str, run_root: str | Path | None = None) -> Sweep:
        """A sweep from its folder, its id or a unique prefix of its id."""
        return cls(find_sweep(ref, run_root))

    # ---------------------------------------------------------------- submit
    @classmethod
    def plan(
        cls,
        job: str | Path | specmod.JobText,
        *,
        grid: Sequence[str] = (),
        zipped: Sequence[str] = (),
        max_parallel: int | None = None,
        overrides: Sequence[str] = (),
        executor: launch.Requested = "auto",
        values: SweepSection | None = None,
    ) -> Planned:
        """Every point typed and checked as a run on the chosen backend; nothing made or queued.
        `job`: a job file, or the TUI's form as text; the varied keys as `sweepplan.vary` takes them."""
        text = job if isinstance(job, specmod.JobText) else specmod.JobText.read(job)
        varied = vary(text, grid=grid, zipped=zipped, max_parallel=max_parallel, overrides=overrides, values=values)
        backend, notice = backends.for_request(executor)
        sweep_id = "sw" + runfolder.new_run_id()
        name = f"{varied.name[:70]}-{sweep_id}"
        specs, prepared = [], []
        for p, point_spec in zip(varied.points, varied.specs, strict=True):
            with at_point(p, varied.shared):
                spec = _named(point_spec, name)
                specs.append(spec)
                backend.check(spec)
                refjob.check(spec, "sweep")
                if backend.executor is Executor.SLURM and (problem := arraylaunch.array_refusal(specs)):
                    raise SweepError([problem])
                prepared.append(Run.check_new(spec, backend))
        keys, parallel = varied.keys, varied.max_parallel
        return Planned(sweep_id, varied.name, keys, varied.points, prepared, parallel, backend, notice)

    @classmethod
    def submit(cls, planned: Planned) -> Sweep:
        """Make the sweep folder with every point's run folder, then queue: one job array on
        Slurm, the local driver otherwise. Nothing is left behind if queueing fails."""
        specs = [pr.spec for pr in planned.prepared]
        folder = runfolder.job_folder(specs[0])
        run_prefix = planned.sweep_id.removeprefix("sw") + "-p"
        executor = planned.backend.executor
        made = [SweepPoint(p.index, f"{run_prefix}{p.index}", p.values) for p in planned.points]
        record = SweepRecord(planned.sweep_id, planned.name, executor, time.time(), planned.keys, made,
                             planned.max_parallel)  # fmt: skip
        try:
            folder.mkdir(parents=True, exist_ok=False)
        except OSError as e:
            raise launch.SubmitError(f"job.run_root: cannot create the sweep folder: {e}") from None
        sweep = cls(folder)
        try:
            sweep.folder.write_record(record)
            runs = [Run.create(pr, executor, pt.run_id) for pr, pt in zip(planned.prepared, made, strict=True)]
            if executor is Executor.SLURM:
                sweep._queue_array(record, runs, specs, folder / run_prefix)
            else:
                sweep._start_driver()
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return sweep

    def _queue_array(self, record: SweepRecord, runs: list[Run], specs: list[specmod.JobSpec], prefix: Path) -> None:
        """The held array, every point's attempt recorded, then released; an array that could
        not be recorded is cancelled (it never ran: it was held)."""
        queued = arraylaunch.queue_array(specs, [r.folder for r in runs], prefix, record.max_parallel)
        record.job_id = queued[0].job_id.split("_")[0]
        try:
            slurm = backends.Slurm()
            for run, q, spec in zip(runs, queued, specs, strict=True):
                run.record_first(q, slurm, spec)
            self.folder.write_record(record)
        except BaseException:
            with contextlib.suppress(slurmcli.SlurmError):
                slurmcli.scancel(record.job_id)
            raise
        launch.start(launch.Queued(record.job_id, held=True))

    def _start_driver(self) -> None:
        """The local driver, detached (`drive --detach` forks again in a session of its own and
        records itself in driver.json): neither this terminal, a Ctrl-C there, nor this process's
        end reaches it, and no zombie of it is left to this process."""
        with open(self.folder.driver_log, "ab") as log:
            subprocess.run(
                [sys.executable, "-m", "clusterfsdp.control.sweep", "drive", str(self.path), "--detach"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
            )

    # ---------------------------------------------------------------- cancel, resume
    def cancel(self, wait_s: float = 15.0) -> list[str]:
        """No point starts any more (the local driver is told and waited for; Slurm's pending
        tasks are cancelled with the rest), then every live point's attempt is cancelled
        (`Run.cancel`: its workers save first)."""
        record = self.record()
        record.cancelled = time.time()
        self.folder.write_record(record)
        deadline, driver = time.monotonic() + wait_s, self.folder.driver()
        while driver is not None and procs.group_alive(driver) and time.monotonic() < deadline:
            time.sleep(0.2)
        rows, error = self.statuses()
        if error:
            raise SweepError([f"sweep {record.sweep_id}: cannot tell which points are live: {error}"])
        out = []
        for row in rows:
            run_id, st = row.point.run_id, row.status
            if not st.attempts:
                out.append(f"run {run_id}: not started; it will not start")
            elif not st.state.live:
                out.append(f"run {run_id}: {st.state}")
            else:
                try:
                    out.append(Run(st.run).cancel())
                except RunError as e:
                    out.append(f"run {run_id}: {e.one_line()}")
        return out

    def resume(self, executor: launch.Requested | None = None, force: bool = False) -> list[str]:
        """Every point that did not complete and is not live again: from its newest checkpoint
        (`Run.resume`, a single job per point on Slurm), or, for a point never started, its first
        attempt (locally by a new driver, `max_parallel` at a time)."""
        record = self.record()
        rows, _ = self.statuses()
        out, unstarted = [], []
        for row in rows:
            st, run = row.status, Run(row.status.run)
            if st.state is RunState.COMPLETED or (st.state.live and not force):
                continue
            if not st.attempts:
                unstarted.append(row.point.run_id)
                continue
            sub = run.resume(executor=executor, force=force)
            out.append(f"run {run.id}: job {sub.job_id} resumes from step {sub.resume_step or 0}")
        if unstarted:
            if record.executor is Executor.SLURM:
                for run_id in unstarted:
                    sub = Run(self.path / run_id).start_first(backends.Slurm())  # a single job
                    out.append(f"run {run_id}: job {sub.job_id if sub else '-'} started")
            else:
                record.cancelled = None
                self.folder.write_record(record)
                self._start_driver()
                out.append(f"{len(unstarted)} point(s) not started yet: the local driver starts them in turn")
        return out or ["every point completed or is live: nothing to resume"]

    # ---------------------------------------------------------------- the local driver
    def drive(self, poll_s: float = DRIVER_POLL_S) -> int:
        """Start the points that have no attempt, in order, `max_parallel` (default 1) at a time,
        until every one started and ended, or the sweep is cancelled (then at once: `cancel`
        stops the live points itself)."""
        record = self.record()
        backend = backends.Local()
        limit = record.max_parallel or 1
        waiting = [Run(self.folder.run_folder(p)) for p in record.points]
        running: list[Run] = []
        while (waiting or running) and self.record().cancelled is None:
            running = [r for r in running if _live(r, backend)]
            while waiting and len(running) < limit and self.record().cancelled is None:
                run = waiting.pop(0)
                try:
                    if run.start_first(backend) is not None:
                        running.append(run)
                        print(f"started {run.id}", flush=True)
                except UserError as e:
                    print(f"{run.id}: not started: {e.one_line()}", flush=True)
            time.sleep(poll_s)
        return 0

    def detach(self) -> None:
        """Become the driver in a new session, recorded in sweep.json (the parent returns)."""
        if os.fork() > 0:
            os._exit(0)
        os.setsid()
        self.folder.write_driver(procs.ProcessId.of(os.getpid()))


def _named(spec: specmod.JobSpec, name: str) -> specmod.JobSpec:
    """The point's spec in the sweep folder: job.name is the sweep folder's name."""
    return replace(spec, job=replace(spec.job, name=name))


def _live(run: Run, backend: backends.Backend) -> bool:
    last = run.folder.record().last
    return last is not None and backend.is_live(last)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or argv[0] != "drive" or argv[2:] not in ([], ["--detach"]):
        print("usage: python -m clusterfsdp.control.sweep drive SWEEP_DIR [--detach]", file=sys.stderr)
        return 2
    sweep = Sweep(Path(argv[1]))
    if argv[2:]:
        sweep.detach()
    retrynotes.report_retries(retrynotes.say_on_stderr)
    with contextlib.suppress(KeyboardInterrupt):
        return sweep.drive()
    return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
