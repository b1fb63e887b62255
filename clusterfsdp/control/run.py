"""The run service: submit, resume, cancel, status and export of one run, the only code that
changes a run folder from the control plane. The CLI, the TUI and the notebook call it; none of
them orchestrates.

Integrity rules it keeps (docs/run-folder.md):
- Commands that change a run hold the run's lock file (`.lock`, NFS-safe, control.lock), so of
  two concurrent resumes exactly one proceeds; the other is told who holds the run.
- A run with a live attempt (queued or running in Slurm, or a local process group that is still
  the recorded one) gets no second attempt beside it: `resume` refuses, naming the attempt, unless
  `force`, which cancels it, waits until it is gone (its workers save first) and then resumes.
- A refused or failed resume changes nothing: the job.toml, the checkpoints and state.json are
  only touched once every check passed, and restored if queueing the attempt fails.
- Redacted secrets must be in the resuming environment (or the caller says to go on without).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from . import ckptfolder, datasource, hub, launch, lock, modelsource, procs, runfolder, secretenv, slurmcli, status
from . import spec as specmod
from .records import Attempt, Cause, Executor, RunState
from .runfolder import RunFolder


class RunError(RuntimeError):
    """A request the run service refuses; the message is one line for the user (exit 2)."""


class RunBusy(RunError):
    """The run has a live attempt, or another command is changing it."""


@dataclass(frozen=True)
class Submission:
    run: Run
    executor: Executor
    job_id: str
    notice: str
    resume_step: int | None = None
    notes: tuple[str, ...] = ()  # from modelsource.prepare (hub downloads, tokenizer notes)


class Run:
    """One run folder and what may be done with it."""

    def __init__(self, folder: RunFolder | Path | str):
        self.folder = folder if isinstance(folder, RunFolder) else RunFolder(Path(folder))

    def __repr__(self) -> str:
        return f"Run({str(self.folder.path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run) and other.folder == self.folder

    def __hash__(self) -> int:
        return hash(self.folder)

    @property
    def id(self) -> str:
        return self.folder.id

    @property
    def path(self) -> Path:
        return self.folder.path

    # ---------------------------------------------------------------- finding runs
    @classmethod
    def find(cls, ref: str, run_root: str | Path | None = None) -> Run:
        """A run from its folder, its id, or a unique prefix of its id (RunError if none or many)."""
        try:
            return cls(runfolder.find_run(ref, run_root))
        except runfolder.RunNotFound as e:
            raise RunError(str(e)) from None

    @classmethod
    def all(cls, run_root: str | Path | None = None) -> list[Run]:
        """Runs under the run root (default: runroot.default_run_root()), newest first."""
        from .runroot import default_run_root

        root = Path(run_root).expanduser() if run_root is not None else default_run_root()
        return [cls(f) for f in runfolder.list_runs(root)]

    # ---------------------------------------------------------------- submit
    @classmethod
    def submit(cls, spec: specmod.JobSpec, executor: launch.Requested = "auto") -> Submission:
        """Check `spec` completely, resolve hub ids (downloading a missing snapshot here, never on
        the compute nodes) and check the model and tokenizer folders, create the run folder (with
        the small files export needs in <run>/model/) and queue its first attempt; nothing is left
        behind if queueing fails."""
        chosen, notice = launch.choose_executor(executor)
        _check_submittable(spec, chosen)
        prepared = prepare_sources(spec)
        spec = prepared.spec
        folder = runfolder.create_run(spec, chosen)
        run = cls(folder)
        try:
            modelsource.keep(prepared, folder.model_dir)
            queued = launch.queue(spec, chosen, folder)
        except BaseException:
            shutil.rmtree(folder.path, ignore_errors=True)
            raise
        folder.add_attempt(queued.job_id, chosen, "submit", leader=queued.leader)
        launch.start(queued)
        return Submission(run, chosen, queued.job_id, notice, notes=tuple(prepared.notes))

    @classmethod
    def prepare(cls, spec: specmod.JobSpec) -> tuple[Run, str]:
        """A dry run: the run folder and the exact sbatch script to submit by hand (sbatch.sh)."""
        _check_submittable(spec, Executor.SLURM)
        prepared = prepare_sources(spec)
        spec = prepared.spec
        folder = runfolder.create_run(spec, Executor.SLURM)
        modelsource.keep(prepared, folder.model_dir)
        record = folder.record()
        record.dry_run = True  # its worker records the hand-submitted job as an attempt
        folder.write_record(record)
        script = launch.render_sbatch(spec, folder)
        runfolder.atomic_write(folder.sbatch_script, script)
        return cls(folder), script

    # ---------------------------------------------------------------- state
    def status(self) -> status.RunStatus:
        return status.run_status(self.folder)

    def live_attempt(self) -> Attempt | None:
        """The last attempt if it still holds or waits for resources; RunError if that cannot be
        told (Slurm does not answer)."""
        last = self.folder.record().last
        if last is None:
            return None
        if last.executor is Executor.SLURM:
            try:
                row = slurmcli.job_states([last.job_id]).get(last.job_id)
            except slurmcli.SlurmError as e:
                raise RunError(f"run {self.id}: cannot tell whether job {last.job_id} is still live: {e}") from None
            return last if row is not None and RunState.parse(row.state).live else None
        return last if status.attempt_alive(last) else None

    def _locked(self, purpose: str, timeout_s: float = 0.0) -> lock.FileLock:
        try:
            return lock.FileLock(self.folder.lock_file, purpose).acquire(timeout_s)
        except lock.LockHeld as e:
            who = e.owner.describe() if e.owner else "another command"
            raise RunBusy(f"run {self.id} is being changed by {who}; try again when it is done") from None

    # ---------------------------------------------------------------- resume
    def resume(
        self,
        *,
        step: int | None = None,
        overrides: Iterable[str] = (),
        executor: launch.Requested | None = None,
        force: bool = False,
        without_secrets: bool = False,
        wait_s: float = 300.0,
    ) -> Submission:
        """A new attempt from the newest complete checkpoint (or the one at `step`; newer ones are
        set aside, never deleted), with `overrides` applied to the run's job.toml."""
        held = self._locked("resume")
        try:
            live = self.live_attempt()
            if live is not None and not force:
                raise RunBusy(
                    f"run {self.id} has a live attempt: {live.executor} job {live.job_id} "
                    f"({self.status().state}); cancel it first, or resume with --force to cancel it, "
                    "wait for its checkpoint and resume"
                )
            spec = self.folder.spec(list(overrides))
            chosen, notice = launch.choose_executor(executor or _requested(self.folder.record().executor))
            _check_submittable(spec, chosen)
            problems = datasource.check(spec)  # (its sources were resolved at submit)
            if problems:
                raise specmod.SpecError(problems)
            missing = secretenv.missing(spec.env)
            if missing and not without_secrets:
                raise RunError(
                    f"run {self.id}: the secret(s) {', '.join(missing)} were redacted from the run folder and are "
                    "not in this environment; export them, or resume --without-secrets to go on without them"
                )
            root = self.folder.checkpoints_dir(spec)
            target = ckptfolder.find(root, step)
            if step is not None and target is None:
                have = ", ".join(str(c.step) for c in ckptfolder.list_checkpoints(root)) or "none"
                raise RunError(f"run {self.id}: no complete checkpoint at step {step} (have: {have})")
            if live is not None:
                self._cancel_attempt(live)
                self._wait_gone(wait_s)
                target = ckptfolder.find(root, step)  # the cancelled attempt saved a newer one
            from . import lrschedule  # (only `resume` needs it)

            sub = self._start_attempt(spec, chosen, notice, target, set_aside=step is not None)
            return replace(sub, notes=lrschedule.resume_notes(target, spec.train))
        finally:
            held.release()

    def _start_attempt(
        self,
        spec: specmod.JobSpec,
        executor: Executor,
        notice: str,
        target: ckptfolder.CheckpointInfo | None,
        *,
        set_aside: bool,
    ) -> Submission:
        """Write the new job.toml, set newer checkpoints aside and queue; undo both on failure."""
        folder = self.folder
        previous = folder.job_toml.read_text()
        runfolder.atomic_write(folder.job_toml, specmod.dumps(spec, redact=True))
        moved: list[tuple[Path, Path]] = []
        try:
            if set_aside and target is not None:
                moved = ckptfolder.keep_only_up_to(target.path.parent, target.step)
            queued = launch.queue(spec, executor, folder)
        except BaseException:
            for original, aside in moved:
                os.replace(aside, original)
            runfolder.atomic_write(folder.job_toml, previous)
            raise
        reason = f"resume from step {target.step}" if target else "resume from scratch (no checkpoint)"
        resume_step = target.step if target else None
        folder.add_attempt(queued.job_id, executor, reason, resume_step=resume_step, leader=queued.leader)
        launch.start(queued)
        return Submission(self, executor, queued.job_id, notice, resume_step)

    def follow_up(
        self,
        spec: specmod.JobSpec,
        reason: str,
        after_job: str,
        *,
        cause: Cause | None = None,
        exclude: tuple[str, ...] = (),
        overrides: tuple[str, ...] = (),
    ) -> Submission:
        """A Slurm job that takes over once the running one (`after_job`) ends
        (`--dependency=afterany`), submitted from inside that job: by its rank 0 when Slurm refuses
        to requeue it, or by its batch script after an infrastructure failure (control.jobstep),
        with `exclude`d nodes and `overrides` (fewer nodes). The running job is the live attempt,
        so there is no liveness check; the run lock keeps a concurrent resume out, and the caller
        checked that the running job is still the run's last attempt."""
        held = self._locked("follow-up", timeout_s=60.0)
        try:
            if overrides:
                spec = specmod.loads(specmod.dumps(spec), list(overrides))
                runfolder.atomic_write(self.folder.job_toml, specmod.dumps(spec, redact=True))
            queued = launch.queue(
                spec, Executor.SLURM, self.folder, dependency=f"afterany:{after_job}", exclude=exclude
            )
            self.folder.add_attempt(queued.job_id, Executor.SLURM, reason, cause=cause, exclude=list(exclude))
            launch.start(queued)
            return Submission(self, Executor.SLURM, queued.job_id, "follow-up job")
        finally:
            held.release()

    def come_back(
        self, spec: specmod.JobSpec, job_id: str, restart: int, cause: Cause, *, requeue: bool = True
    ) -> tuple[Submission, str] | None:
        """Bring an interrupted Slurm job back: `scontrol requeue` (it keeps its id; None), or,
        where Slurm refuses (--no-requeue, a job already ending) or `requeue` is False, a follow-up
        job that takes over once this one ends: (its submission, why). A controller that does not
        answer is not a refusal: its SlurmError is raised."""
        why = "the job is already ending"
        if requeue:
            try:
                slurmcli.requeue(job_id, restart)
                return None
            except slurmcli.SlurmError as e:
                if e.transient:
                    raise
                why = str(e)
        return self.follow_up(spec, f"follow-up: requeue refused ({why})", job_id, cause=cause), why

    # ---------------------------------------------------------------- cancel
    def cancel(self, grace_s: float = 20.0) -> str:
        """Stop the live attempt: its workers save a checkpoint at the next step boundary and exit
        (Slurm: scancel; local: SIGTERM to the recorded process group, SIGKILL after `grace_s`)."""
        held = self._locked("cancel", timeout_s=30.0)
        try:
            last = self.folder.record().last
            if last is None:
                raise RunError(f"run {self.id} has no submitted attempt")
            if last.executor is not Executor.SLURM and not status.attempt_alive(last):
                return f"run {self.id}: nothing running"
            message = self._cancel_attempt(last)
            if last.executor is Executor.SLURM or last.leader is None:
                return message
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and procs.group_alive(last.leader):
                time.sleep(0.2)
            if procs.signal_group(last.leader, signal.SIGKILL):
                return f"local job {last.job_id}: killed after {grace_s:.0f} s"
            return f"local job {last.job_id}: stopped"
        finally:
            held.release()

    def _cancel_attempt(self, attempt: Attempt) -> str:
        self.folder.update_attempt(attempt.job_id, cancelled=time.time())
        if attempt.executor is Executor.SLURM:
            try:
                slurmcli.scancel(attempt.job_id)
            except slurmcli.SlurmError as e:
                raise RunError(f"run {self.id}: {e}") from None
            return f"scancel {attempt.job_id}: sent"
        if attempt.leader is not None and procs.signal_group(attempt.leader, signal.SIGTERM):
            return f"local job {attempt.job_id}: SIGTERM sent"
        return f"run {self.id}: nothing running"

    def _wait_gone(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while self.live_attempt() is not None:
            if time.monotonic() > deadline:
                raise RunBusy(f"run {self.id}: the cancelled attempt is still live after {wait_s:.0f} s")
            time.sleep(1.0)

    # ---------------------------------------------------------------- export
    def export_command(
        self, to: Path, step: int | None = None, dtype: str | None = None, force: bool = False
    ) -> list[str]:
        """The worker-side command that writes a checkpoint as a HuggingFace folder (run as a
        subprocess: the control plane never imports torch). It checks `to` itself (not empty
        without `force`) and prints one line on failure."""
        spec = self.folder.spec()
        info = ckptfolder.find(self.folder.checkpoints_dir(spec), step)
        if info is None:
            at = f" at step {step}" if step is not None else ""
            raise RunError(f"run {self.id}: no complete checkpoint{at}")
        argv = [sys.executable, "-m", "clusterfsdp.worker.export", str(self.path), "--step", str(info.step)]
        argv += ["--to", str(Path(to).expanduser())]
        argv += ["--dtype", dtype] if dtype else []
        return argv + (["--force"] if force else [])

    def export(self, to: Path, step: int | None = None, dtype: str | None = None, force: bool = False) -> int:
        """Run the export in a subprocess (its progress goes to this terminal); its exit status."""
        return subprocess.run(self.export_command(to, step, dtype, force)).returncode


def _requested(previous: Executor) -> launch.Requested:
    """A resume runs where the run ran, except a notebook's srun step, which needs an allocation."""
    return "slurm" if previous is Executor.SLURM else "local" if previous is Executor.LOCAL else "auto"


def _check_submittable(spec: specmod.JobSpec, executor: Executor) -> None:
    """Everything that can be checked before a folder is made or anything is queued."""
    specmod.check(spec)
    launch.check_run_root(spec)
    launch.check_container(spec, executor)
    launch.check_trackers(spec)
    if executor is Executor.LOCAL and spec.slurm.nodes > 1:
        raise launch.SubmitError(
            f"slurm.nodes = {spec.slurm.nodes}: the local executor runs on one machine; "
            "use Slurm (try `clusterfsdp devcluster up` for a local test cluster) or set slurm.nodes = 1"
        )
    if executor is Executor.SLURM:
        launch.sbatch_options(spec)


def prepare_sources(spec: specmod.JobSpec, mode: hub.Mode = "download") -> modelsource.Prepared:
    """After the cheap checks: hub ids resolved (submit: a missing snapshot downloaded here, never
    on the compute nodes; validate: mode 'check'), the model and tokenizer folders checked, then
    the data sources read (readable, not smaller than a batch; they may need the resolved
    tokenizer). SpecError with every problem."""
    prepared = modelsource.prepare(spec, mode)
    problems = datasource.check(prepared.spec)
    if problems:
        raise specmod.SpecError(problems)
    return prepared
