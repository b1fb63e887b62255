"""The run service: submit, resume, cancel, status and export of one run, the only code that
changes a run folder from the control plane. The CLI, the TUI and the notebook call it; none of
them orchestrates. Where an attempt runs is a backend object (`control.backends`: Slurm, local,
an srun step in the notebook's allocation): `submit`, `resume` and `srun` choose one, and
`cancel` and the liveness checks ask the backend of the recorded attempt.

Integrity rules it keeps (docs/run-folder.md):
- Commands that change a run hold the run's lock file (`.lock`, NFS-safe, control.lock), so of
  two concurrent resumes exactly one proceeds; the other is told who holds the run.
- A run with a live attempt (queued or running in Slurm, or a local process group that is still
  the recorded one) gets no second attempt beside it: `resume` refuses, naming the attempt, unless
  `force`, which cancels it, waits until it is gone (its workers save first) and then resumes.
- A refused or failed resume changes nothing: the job.toml, the checkpoints and state.json are
  only touched once every check passed, and restored if queueing the attempt fails.
- Redacted secrets must be in the resuming environment (or the caller says to go on without).

Over 500 lines on purpose: `Run` is the one class that changes a run folder, and the integrity
rules above hold only if every operation that changes it (and its lock) is in one place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..core import (
    ckptfolder,
    fileio,
    lock,
    lrschedule,
    modelsource,
    peftbase,
    runfolder,
    secretenv,
    slurmcli,
    warmlaunch,
)
from ..core import spec as specmod
from ..core.errors import UserError
from ..core.records import Attempt, Cause, Executor, RunState
from ..core.runfolder import RunFolder
from ..core.runroot import default_run_root
from ..core.spec import benchmetric
from ..core.value import value
from ..data import checks as datachecks
from . import backends, cost, launch, noderecord, prepjob, refjob, status
from .inputs import prepare_sources

# Seconds the workers of a cancelled attempt get to save before SIGKILL (where no scheduler decides).
GRACE_S = 20.0


class RunError(UserError, RuntimeError):
    """A request the run service refuses; the message is one line for the user (exit 2)."""


class RunBusy(RunError):
    """The run has a live attempt, or another command is changing it."""


@value(frozen=True)
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
        root = Path(run_root).expanduser() if run_root is not None else default_run_root()
        return [cls(f) for f in runfolder.list_runs(root)]

    # ---------------------------------------------------------------- submit
    @classmethod
    def submit(cls, spec: specmod.JobSpec, executor: launch.Requested = "auto") -> Submission:
        """Check `spec` completely, resolve hub ids (downloading a missing snapshot here, never on
        the compute nodes) and check the model and tokenizer folders, create the run folder (with
        the small files export needs in <run>/model/) and queue its first attempt; nothing is left
        behind if queueing fails."""
        backend, notice = backends.for_request(executor)
        return cls._first_attempt(spec, backend, notice)

    @classmethod
    def srun(cls, spec: specmod.JobSpec, backend: backends.SrunStep | backends.LocalRanks, notice: str) -> Submission:
        """A notebook's launch (`clusterfsdp.notebook.srun`): the same checks, hub resolution and
        data check as `submit`, the run folder, and the launcher process started by `backend` (an
        srun step of the kernel's allocation, or local ranks) and recorded as the first attempt.
        The caller streams `backend.proc`'s output and stops it with `cancel`."""
        return cls._first_attempt(spec, backend, notice)

    @classmethod
    def _first_attempt(cls, spec: specmod.JobSpec, backend: backends.Backend, notice: str) -> Submission:
        """Check `spec` completely, prepare its sources, create the run folder and queue its first
        attempt on `backend`; nothing is left behind if queueing fails."""
        slurm = backend.executor is Executor.SLURM
        prepared = cls.check_new(spec, backend)
        run = cls.create(prepared, backend.executor)
        try:
            # data.prepare = 'job' on Slurm: a prepare array first, the training job after it
            array = prepjob.before_training(prepared.spec, run.folder, slurm=slurm)
            # dpo/ipo on Slurm: the reference pass next (after the array), the training job after both
            dependency = refjob.before_training(prepared.spec, run.folder, slurm=slurm, after=array)
            queued = backend.queue(prepared.spec, run.folder, dependency=dependency)
        except BaseException:
            prepjob.abandon(run.folder)
            refjob.abandon(run.folder)
            shutil.rmtree(run.path, ignore_errors=True)
            raise
        run.record_first(queued, backend, prepared.spec)
        backend.start(queued)
        notes = [*prepared.notes, *queued.notes]
        if array:  # (the training job is queued behind the prepare array)
            notes.append(f"data: not prepared yet: job {queued.job_id} waits for data prepare job "
                         f"{array.removeprefix('afterok:')}")  # fmt: skip
        if reference := refjob.recorded(run.path):
            notes.append(f"reference log-probs: job {queued.job_id} waits for reference job {reference}")
        return Submission(run, backend.executor, queued.job_id, notice, notes=tuple(notes))

    @classmethod
    def check_new(cls, spec: specmod.JobSpec, backend: backends.Backend) -> modelsource.Prepared:
        """Every check of a new run on `backend`, then its sources prepared (hub ids resolved, the
        data read); nothing is made. A sweep checks all its points this way before making any."""
        _check_submittable(spec, backend)
        refjob.check(spec, str(backend.executor))
        return prepare_sources(spec)

    @classmethod
    def create(cls, prepared: modelsource.Prepared, executor: Executor, run_id: str | None = None) -> Run:
        """The run folder of a checked spec (`check_new`), with the small files export needs in
        <run>/model/; no attempt yet (`record_first`, or `start_first` for a prepared point)."""
        folder = _create_run(prepared.spec, executor, run_id)
        try:
            modelsource.keep(prepared, folder.model_dir)
        except BaseException:
            shutil.rmtree(folder.path, ignore_errors=True)
            raise
        return cls(folder)

    def record_first(self, queued: launch.Queued, backend: backends.Backend, spec: specmod.JobSpec) -> None:
        """Record a queued first attempt (before `backend.start` lets it run)."""
        fields = backend.attempt_fields(spec, self.folder)
        self.folder.add_attempt(queued.job_id, backend.executor, backend.reason, leader=queued.leader, **fields)

    def start_first(self, backend: backends.Backend) -> Submission | None:
        """Queue the first attempt of a run folder made by `create` and not started yet (a local
        sweep's next point), under the run lock; None when it has an attempt already."""
        self._check_yours("start")
        held = self._locked("start")
        try:
            if self.folder.record().attempts:
                return None
            spec = self.folder.spec()
            queued = backend.queue(spec, self.folder)
            self.record_first(queued, backend, spec)
            backend.start(queued)
            return Submission(self, backend.executor, queued.job_id, "sweep point")
        finally:
            held.release()

    @classmethod
    def dry_run(cls, spec: specmod.JobSpec) -> tuple[Run, str]:
        """A dry run: the same checks and source preparation as `submit` for Slurm, the run folder,
        and the exact sbatch script to submit by hand (sbatch.sh); nothing is queued."""
        slurm = backends.Slurm()
        refjob.check(spec, "dry run")
        prepared = cls.check_new(spec, slurm)
        folder = cls.create(prepared, slurm.executor).folder
        record = folder.record()
        record.dry_run = True  # its worker records the hand-submitted job as an attempt
        folder.write_record(record)
        script = launch.render_sbatch(prepared.spec, folder, exclude=noderecord.plan(prepared.spec)[0])
        fileio.atomic_write(folder.sbatch_script, script)
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
        try:
            return last if backends.for_attempt(last).is_live(last) else None
        except slurmcli.SlurmError as e:
            raise RunError(f"run {self.id}: cannot tell whether job {last.job_id} is still live: {e}") from None

    def _check_yours(self, action: str) -> None:
        """Never act on a run another user could have planted or changed (runfolder.refusal)."""
        if problem := runfolder.refusal(self.folder, action):
            raise RunError(problem)

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
        self._check_yours("resume")
        held = self._locked("resume")
        try:
            live = self.live_attempt()
            if live is not None and not force:
                st = self.status()
                if st.state is RunState.COMPLETING:  # refused, not waited for: the step may queue a restart
                    raise RunBusy(
                        f"run {self.id} is COMPLETING ({st.reason}); resume once `clusterfsdp status {self.id}` "
                        "shows how it ended"
                    )
                raise RunBusy(
                    f"run {self.id} has a live attempt: {live.executor} job {live.job_id} "
                    f"({self.status().state}); cancel it first, or resume with --force to cancel it, "
                    "wait for its checkpoint and resume"
                )
            spec = self.folder.spec(list(overrides))
            backend, notice = backends.for_request(executor or backends.requested_for(self.folder.record().executor))
            _check_submittable(spec, backend)
            self._check_budget(spec, backend)
            problems = datachecks.problems(spec)  # (its sources were resolved at submit)
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
            if target is not None and spec.peft.method == "lora" and (why := peftbase.problem(spec, target.meta)):
                raise RunError(f"run {self.id}: {why}")
            if live is not None:
                self._cancel_attempt(live, backends.for_attempt(live))
                self._wait_gone(wait_s)
                target = ckptfolder.find(root, step)  # the cancelled attempt saved a newer one

            sub = self._start_attempt(spec, backend, notice, target, set_aside=step is not None)
            return replace(sub, notes=lrschedule.resume_notes(target, spec.train))
        finally:
            held.release()

    def _check_budget(self, spec: specmod.JobSpec, backend: backends.Backend) -> None:
        """slurm.max_gpu_hours: the new attempt's plan must fit what the run has not used yet."""
        if spec.slurm.max_gpu_hours <= 0 or backend.executor is not Executor.SLURM:
            return
        spent = cost.run_cost(self.folder)
        why = specmod.budget_refusal(spec, spent.total.gpu_hours if spent else 0.0)
        if why:
            raise RunError(f"run {self.id}: {why}")

    def _start_attempt(
        self,
        spec: specmod.JobSpec,
        backend: backends.Backend,
        notice: str,
        target: ckptfolder.CheckpointInfo | None,
        *,
        set_aside: bool,
    ) -> Submission:
        """Write the new job.toml, set newer checkpoints aside and queue; undo both on failure."""
        folder = self.folder
        previous = folder.job_toml.read_text()
        fileio.atomic_write(folder.job_toml, specmod.dumps(spec, redact=True))
        moved: list[tuple[Path, Path]] = []
        try:
            if set_aside and target is not None:
                moved = ckptfolder.keep_only_up_to(target.path.parent, target.step)
            queued = backend.queue(spec, folder)
        except BaseException:
            for original, aside in moved:
                os.replace(aside, original)
            fileio.atomic_write(folder.job_toml, previous)
            raise
        reason = f"resume from step {target.step}" if target else "resume from scratch (no checkpoint)"
        resume_step = target.step if target else None
        folder.add_attempt(queued.job_id, backend.executor, reason, resume_step=resume_step, leader=queued.leader)
        backend.start(queued)
        return Submission(self, backend.executor, queued.job_id, notice, resume_step)

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
                fileio.atomic_write(self.folder.job_toml, specmod.dumps(spec, redact=True))
            slurm = backends.Slurm()
            queued = slurm.queue(spec, self.folder, dependency=f"afterany:{after_job}", exclude=exclude)
            self.folder.add_attempt(queued.job_id, slurm.executor, reason, cause=cause, exclude=list(exclude))
            slurm.start(queued)
            return Submission(self, slurm.executor, queued.job_id, "follow-up job")
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

    # ---------------------------------------------------------------- remove
    def remove(self) -> str:
        """Delete the run: its folder and its checkpoints (also where checkpoint.dir put them).
        Refused for a folder another user owns and while an attempt is live (or Slurm cannot
        say); under the run lock. state.json goes first, so a crash midway leaves no half run
        in `runs`."""
        checkpoints = self.path / "checkpoints"
        try:
            checkpoints = self.folder.checkpoints_dir()
        except (specmod.SpecError, OSError):  # a damaged job.toml: the checkpoints in the folder only
            pass
        for path in (self.path, checkpoints):
            if path.exists() and path.stat().st_uid != os.getuid():
                raise RunError(f"run {self.id}: {path} belongs to another user (uid {path.stat().st_uid}); not removed")
        held = self._locked("remove")
        try:
            live = self.live_attempt()
            if live is not None:
                raise RunBusy(f"run {self.id} has a live attempt ({live.executor} job {live.job_id}); cancel it first")
            self.folder.state_file.unlink(missing_ok=True)
            if not checkpoints.is_relative_to(self.path):
                shutil.rmtree(checkpoints, ignore_errors=True)
            shutil.rmtree(self.path)
        finally:
            held.release()
        with contextlib.suppress(OSError):  # the job name's folder, once its last run is gone
            self.path.parent.rmdir()
        return f"removed run {self.id} ({self.path})"

    # ---------------------------------------------------------------- cancel
    def cancel(self, grace_s: float = GRACE_S, *, pause: Callable[[float], None] = time.sleep) -> str:
        """Stop the live attempt: its workers save a checkpoint at the next step boundary and exit
        (Slurm: scancel, and Slurm's own KillWait after that; otherwise its backend's SIGTERM, and
        SIGKILL to what is left after `grace_s`). `pause(seconds)` is how to wait meanwhile (the
        notebook keeps showing the ranks' output)."""
        self._check_yours("cancel")
        held = self._locked("cancel", timeout_s=30.0)
        try:
            last = self.folder.record().last
            if last is None:
                raise RunError(f"run {self.id} has no submitted attempt")
            backend = backends.for_attempt(last)
            message = self._cancel_attempt(last, backend)
            if message is None:  # alive, but its group is this very process's, or another user's
                live = backend.is_live(last)
                return f"run {self.id}: " + (f"{backend.describe(last)} runs, but no signal could be sent to it"
                                             if live else "nothing running")  # fmt: skip
            if backend.scheduled:
                if len(self.folder.record().attempts) == 1 and refjob.abandon(self.folder):
                    message += "; its reference job too"  # (the first attempt waited for it)
                return message
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and backend.is_live(last):
                pause(0.2)
            if not backend.is_live(last):
                return f"{backend.describe(last)}: stopped"
            if backend.kill(last):
                return f"{backend.describe(last)}: killed after {grace_s:.0f} s"
            return f"{backend.describe(last)}: SIGTERM sent; still running after {grace_s:.0f} s, and SIGKILL not sent"
        finally:
            held.release()

    def _cancel_attempt(self, attempt: Attempt, backend: backends.Backend) -> str | None:
        """Record the cancel (the workers read it when the signal comes), then ask the backend;
        None if nothing was signalled (then the record is as it was)."""
        if not backend.scheduled and not backend.is_live(attempt):
            return None
        self.folder.update_attempt(attempt.job_id, cancelled=time.time())
        try:
            said = backend.cancel(attempt)
        except slurmcli.SlurmError as e:
            self.folder.update_attempt(attempt.job_id, cancelled=attempt.cancelled)
            raise RunError(f"run {self.id}: {e}") from None
        if said is None:
            self.folder.update_attempt(attempt.job_id, cancelled=attempt.cancelled)
        return said

    # ---------------------------------------------------------------- a launch the caller watches
    def record_step(self, job_id: str, step: str) -> None:
        """An srun attempt's step id, once a task reported it."""
        self.folder.update_attempt(job_id, step=step)

    def discard(self) -> None:
        """Remove the folder of a run whose only attempt never started (a notebook's srun refused,
        or stopped while it waited for resources): nothing half-created is left behind."""
        shutil.rmtree(self.path, ignore_errors=True)

    def record_end(self, job_id: str, returncode: int | None, exit_codes: dict[int, int | None], **more: Any) -> None:
        """How a launch the caller watched ended (the notebook's: the exit status per rank)."""
        codes = {str(r): c for r, c in sorted(exit_codes.items())}
        self.folder.update_attempt(job_id, ended=time.time(), returncode=returncode, exit_codes=codes, **more)

    def _wait_gone(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while self.live_attempt() is not None:
            if time.monotonic() > deadline:
                raise RunBusy(f"run {self.id}: the cancelled attempt is still live after {wait_s:.0f} s")
            time.sleep(1.0)

    # ---------------------------------------------------------------- export
    def export_command(
        self,
        to: Path,
        step: int | None = None,
        dtype: str | None = None,
        force: bool = False,
        best: bool = False,
        merge: bool = False,
    ) -> list[str]:
        """The worker-side command that writes a checkpoint (the newest, the one at `step`, or
        with `best` the best by checkpoint.keep_best) as a HuggingFace folder (run as a
        subprocess: the control plane never imports torch). It checks `to` itself (not empty
        without `force`) and prints one line on failure. A LoRA run exports its adapters (a PEFT
        adapter folder), or with `merge` a full model with the adapters merged in."""
        chosen = self.export_step(to, step, best)
        argv = [sys.executable, "-m", "clusterfsdp.worker.export", str(self.path), "--step", str(chosen)]
        argv += ["--to", str(Path(to).expanduser())]
        argv += ["--dtype", dtype] if dtype else []
        return argv + (["--force"] if force else []) + (["--merge"] if merge else [])

    def export_step(self, to: Path, step: int | None = None, best: bool = False) -> int:
        """The checkpoint step an export to `to` writes (the newest, `step`, or with `best` the
        best by checkpoint.keep_best), once the control plane's checks pass (RunError: not yours,
        a guarded destination, no such checkpoint); the worker checks `to` itself."""
        self._check_yours("export")
        if problem := runfolder.export_refusal(self.folder, to):
            raise RunError(problem)
        spec = self.folder.spec()
        if best:
            if not spec.checkpoint.keep_best:
                raise RunError(f"run {self.id}: --best needs checkpoint.keep_best (it is off for this run)")
            info = ckptfolder.best(self.folder.checkpoints_dir(spec), spec.checkpoint.keep_best)
            if info is None:
                why = "no evaluation saved one"
                if benchmetric.is_bench(spec.checkpoint.keep_best):
                    why = f"no benchmark result with {spec.checkpoint.keep_best} has landed"
                raise RunError(f"run {self.id}: no best checkpoint yet ({why})")
        else:
            info = ckptfolder.find(self.folder.checkpoints_dir(spec), step)
        if info is None:
            at = f" at step {step}" if step is not None else ""
            raise RunError(f"run {self.id}: no complete checkpoint{at}")
        return info.step

    def wait(self, poll_s: float = 10.0) -> str:
        """Block until the run ends, following requeues, follow-up jobs and automatic restarts;
        rank 0's outcome ('completed' or 'stopped') by submitit's `job.result()`, or submitit's
        `FailedJobError` / `UncompletedJobError` (for a notebook or a script that wants to wait)."""
        return launch.wait(self.folder, backends.still_live, poll_s)

    def export(
        self,
        to: Path,
        step: int | None = None,
        dtype: str | None = None,
        force: bool = False,
        best: bool = False,
        merge: bool = False,
    ) -> int:
        """Run the export in a subprocess (its progress goes to this terminal); its exit status.
        A warm launcher of this user (`CLUSTERFSDP_LAUNCHER`, core/warmlaunch.py) forks it when
        it may; otherwise it starts here."""
        argv = self.export_command(to, step, dtype, force, best, merge)
        return warmlaunch.call(argv)


def _check_submittable(spec: specmod.JobSpec, backend: backends.Backend) -> None:
    """Everything that can be checked before a folder is made or anything is queued."""
    specmod.check(spec)
    launch.check_run_root(spec)
    if problem := runfolder.submit_refusal(spec):
        raise RunError(problem)
    backend.check(spec)
    launch.check_trackers(spec)


def _create_run(spec: specmod.JobSpec, executor: Executor, run_id: str | None = None) -> RunFolder:
    """The run folder; a folder the checked run root still refuses (a race, a full disk) is one line."""
    try:
        return runfolder.create_run(spec, executor, run_id)
    except OSError as e:
        raise launch.SubmitError(f"job.run_root: cannot create the run folder: {e}") from None
