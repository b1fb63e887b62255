"""Backends: where an attempt runs, as objects with one contract, so the run service (`control.run`)
never branches on the executor. Each backend can

- `check` a spec before a run folder is made (what only this backend refuses),
- `queue` an attempt of a run folder and `start` it once the run service recorded it,
- tell whether a recorded attempt `is_live`, `cancel` it (its workers save at the next step
  boundary and exit) and `kill` it when it outlived the grace period.

- `Slurm` (executor slurm): `launch.queue` sbatches a held batch job, `start` releases it once
  recorded; cancel is scancel, and Slurm itself sends SIGKILL after its KillWait.
- `Local` (local): submitit's LocalExecutor on this machine (`launch.queue`); cancel is SIGTERM
  to the recorded process group, `kill` SIGKILL after the grace period.
- `LocalRanks` (local): the notebook's ranks as local processes whose output the caller streams;
  once recorded, an attempt like `Local`'s.
- `SrunStep` (srun): one `srun` step in the allocation the notebook kernel runs in; cancel is
  `scancel --signal=TERM` to the step (srun's process group while no step exists yet).

`for_attempt` gives the backend that knows a recorded attempt (cancel, liveness); `for_request`
the one a submit or resume queues on. The launch mechanics themselves stay in `control.launch`
(batch script, submitit, containers); the notebook builds the launcher command of the streamed
backends (`notebook.placement`), and keeps only its display.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ..core import procs, slurmcli, warmlaunch
from ..core import spec as specmod
from ..core.records import Attempt, Executor, RunState
from ..core.runfolder import RunFolder
from . import launch, noderecord

# What a streamed backend runs for a run folder: (argv, environment) of its launcher process.
LauncherCommand = Callable[[RunFolder], tuple[list[str], Mapping[str, str]]]


class Backend(ABC):
    """Where attempts of a run are queued, and how a recorded one is watched and stopped."""

    executor: ClassVar[Executor]
    # A scheduler owns the attempt: it answers for a job that already ended (so cancel needs no
    # liveness check first) and sends SIGKILL itself after its own grace period.
    scheduled: ClassVar[bool] = False
    reason: ClassVar[str] = "submit"  # the first attempt's reason in state.json

    def check(self, spec: specmod.JobSpec) -> None:
        """What this backend refuses before a run folder is made (SubmitError)."""
        launch.check_container(spec, self.executor)

    @abstractmethod
    def queue(
        self, spec: specmod.JobSpec, run: RunFolder, *, dependency: str | None = None, exclude: tuple[str, ...] = ()
    ) -> launch.Queued:
        """Queue one attempt of `run` (its folder and job.toml exist)."""

    def start(self, queued: launch.Queued) -> None:
        """Let the queued attempt run, once the run service recorded it."""
        launch.start(queued)

    def attempt_fields(self, spec: specmod.JobSpec, run: RunFolder) -> dict[str, Any]:
        """What state.json records about an attempt of this backend besides its job id and leader."""
        return {}

    @abstractmethod
    def is_live(self, attempt: Attempt) -> bool:
        """The attempt still holds or waits for resources (SlurmError when that cannot be told)."""

    @abstractmethod
    def cancel(self, attempt: Attempt) -> str | None:
        """Ask the attempt's workers to save and stop; what was done, in words, or None when
        nothing could be signalled (it ended meanwhile, or its group is not ours to signal)."""

    def kill(self, attempt: Attempt) -> bool:
        """End what is left of the attempt after the grace period; True if anything was signalled."""
        return False

    def describe(self, attempt: Attempt) -> str:
        return f"{self.executor} job {attempt.job_id}"


class Slurm(Backend):
    """A batch job per attempt (`launch.queue`: held until recorded, then released)."""

    executor = Executor.SLURM
    scheduled = True

    def check(self, spec: specmod.JobSpec) -> None:
        super().check(spec)
        launch.sbatch_options(spec)

    def queue(
        self, spec: specmod.JobSpec, run: RunFolder, *, dependency: str | None = None, exclude: tuple[str, ...] = ()
    ) -> launch.Queued:
        """With the nodes the cluster's node record quarantines left out (`noderecord.plan`)."""
        quarantined, notes = noderecord.plan(spec, exclude)
        queued = launch.queue(spec, Executor.SLURM, run, dependency=dependency, exclude=(*exclude, *quarantined))
        return dataclasses.replace(queued, notes=notes)

    def is_live(self, attempt: Attempt) -> bool:
        row = slurmcli.job_states([attempt.job_id]).get(attempt.job_id)
        return row is not None and RunState.parse(row.state).live

    def cancel(self, attempt: Attempt) -> str:
        slurmcli.scancel(attempt.job_id)
        return f"scancel {attempt.job_id}: sent"


class Local(Backend):
    """submitit's local executor on this machine: the attempt is a process group whose leader's
    identity is recorded (`control.procs`), so a reused pid is never signalled."""

    executor = Executor.LOCAL

    def check(self, spec: specmod.JobSpec) -> None:
        super().check(spec)
        if needs := spec.needs_slurm():
            raise launch.SubmitError(
                f"{needs}: the local executor runs on one machine; "
                "use Slurm (try `clusterfsdp devcluster up` for a local test cluster) or set slurm.nodes = 1"
            )

    def queue(
        self, spec: specmod.JobSpec, run: RunFolder, *, dependency: str | None = None, exclude: tuple[str, ...] = ()
    ) -> launch.Queued:
        return launch.queue(spec, Executor.LOCAL, run)

    def is_live(self, attempt: Attempt) -> bool:
        return attempt.group_alive()

    def cancel(self, attempt: Attempt) -> str | None:
        if attempt.leader is not None and procs.signal_group(attempt.leader, signal.SIGTERM):
            return f"{self.describe(attempt)}: SIGTERM sent"
        return None

    def kill(self, attempt: Attempt) -> bool:
        return attempt.leader is not None and procs.signal_group(attempt.leader, signal.SIGKILL)

    def describe(self, attempt: Attempt) -> str:
        return f"local job {attempt.job_id}"


class _Streamed(Backend):
    """A launcher process in its own session whose merged output the caller reads (`proc.stdout`):
    the notebook's srun step or local ranks. One object per launch."""

    # Whether a warm launcher of this user (CLUSTERFSDP_LAUNCHER, core/warmlaunch.py) is asked to
    # fork the launcher process first: the local supervisor (it imports torch), not srun.
    served: ClassVar[bool] = False

    def __init__(self, command: LauncherCommand):
        self.command = command
        self.proc: subprocess.Popen[bytes] | warmlaunch.Served | None = None

    def _popen(self, run: RunFolder) -> procs.ProcessId:
        argv, env = self.command(run)
        if self.served and (served := _served(argv, env)) is not None:
            self.proc = served
            return procs.ProcessId.of(served.pid)
        try:
            self.proc = subprocess.Popen(
                _pdeathsig_shim(argv),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            raise launch.SubmitError(f"could not start {argv[0]}: {e}") from None
        return procs.ProcessId.of(self.proc.pid)  # its own session: the leader's pid is the group id

    def start(self, queued: launch.Queued) -> None:
        """Already running (a launch in the caller's allocation or on this machine is not queued)."""

    def attempt_fields(self, spec: specmod.JobSpec, run: RunFolder) -> dict[str, Any]:
        return {"world_size": spec.world_size}


class LocalRanks(_Streamed, Local):
    """The notebook's ranks as local processes (`python -m clusterfsdp.notebook.tasks _local`): a
    Local attempt once recorded (cancel and liveness by process group)."""

    reason = "notebook (local processes)"
    served = True

    def check(self, spec: specmod.JobSpec) -> None:
        Backend.check(self, spec)
        if needs := spec.needs_slurm():
            raise launch.SubmitError(
                f"{needs}: without it the job runs as local processes on this machine; pass nodes=1 "
                f"(or run the kernel inside `salloc -N{spec.node_range.high}`)"
            )

    def queue(
        self, spec: specmod.JobSpec, run: RunFolder, *, dependency: str | None = None, exclude: tuple[str, ...] = ()
    ) -> launch.Queued:
        leader = self._popen(run)
        return launch.Queued(f"nb{leader.pid}", leader)  # the supervisor's CLUSTERFSDP_JOB_ID (the shim keeps the pid)


class SrunStep(_Streamed):
    """One `srun` job step in the allocation the caller runs in (a notebook kernel inside `salloc`).
    The attempt's job id is the allocation's; the step id is recorded once a task reports it."""

    executor = Executor.SRUN
    reason = "notebook srun"

    def __init__(self, command: LauncherCommand | None = None, *, allocation: str = "", nodes: int | None = None):
        super().__init__(command or _no_launcher)
        self.allocation = allocation
        self.nodes = nodes  # the allocation's node count, when known

    @staticmethod
    def step_name(run: RunFolder) -> str:
        return f"clusterfsdp-nb-{run.id}"

    def check(self, spec: specmod.JobSpec) -> None:
        launch.check_container(spec, Executor.SLURM)  # srun starts the container, as in a batch job
        if spec.node_range.elastic:  # (the step's ranks would follow the allocation, not a range)
            raise launch.SubmitError(
                f"slurm.nodes = {spec.slurm.nodes!r}: a node range is for batch jobs (submit); a notebook's srun "
                "step takes a count: pass nodes=N"
            )
        if self.nodes is not None and spec.node_range.high > self.nodes:
            raise launch.SubmitError(
                f"the step needs {spec.node_range.high} nodes but allocation {self.allocation} has {self.nodes}: "
                f"pass nodes={self.nodes} (or salloc more nodes)"
            )

    def queue(
        self, spec: specmod.JobSpec, run: RunFolder, *, dependency: str | None = None, exclude: tuple[str, ...] = ()
    ) -> launch.Queued:
        return launch.Queued(self.allocation, self._popen(run))

    def attempt_fields(self, spec: specmod.JobSpec, run: RunFolder) -> dict[str, Any]:
        return {**super().attempt_fields(spec, run), "allocation": self.allocation, "step_name": self.step_name(run)}

    def step_of(self, attempt: Attempt) -> str:
        """The step id: recorded once a task reported it, else found by name in `squeue --steps`
        (srun may still wait for resources)."""
        if attempt.step:
            return attempt.step
        rows = squeue_steps(attempt.allocation)
        return next((step for step, name in rows.items() if name == attempt.step_name), "")

    def is_live(self, attempt: Attempt) -> bool:
        if attempt.group_alive():
            return True
        step = self.step_of(attempt)
        return bool(step) and step in squeue_steps(attempt.allocation)

    def cancel(self, attempt: Attempt) -> str | None:
        return self._signal(attempt, signal.SIGTERM)

    def kill(self, attempt: Attempt) -> bool:
        step = self.step_of(attempt)
        self._signal(attempt, signal.SIGKILL)
        if step:
            try:
                slurmcli.run(["scancel", step], timeout=15)
            except slurmcli.SlurmError:
                pass
        killed = attempt.leader is not None and procs.signal_group(attempt.leader, signal.SIGKILL)
        return killed or bool(step)

    def _signal(self, attempt: Attempt, sig: signal.Signals) -> str | None:
        step = self.step_of(attempt)
        name = sig.name.removeprefix("SIG")
        if step:
            try:
                slurmcli.run(["scancel", f"--signal={name}", step], timeout=15)
                return f"srun step {step}: {sig.name} sent"
            except slurmcli.SlurmError:
                pass
        # no step yet (srun still waiting for resources): stop srun itself
        if attempt.leader is not None and procs.signal_group(attempt.leader, sig):
            return f"srun in allocation {attempt.allocation}: {sig.name} sent"
        return None

    def describe(self, attempt: Attempt) -> str:
        step = attempt.step
        return f"srun step {step}" if step else f"srun (no job step yet) in allocation {attempt.allocation}"


def _no_launcher(run: RunFolder) -> tuple[list[str], Mapping[str, str]]:
    raise launch.SubmitError("an srun step is started from a notebook (clusterfsdp.notebook.srun)")


def squeue_steps(allocation: str) -> dict[str, str]:
    """{step id 'J.S': step name} of the allocation's live steps ({} when Slurm does not answer)."""
    if not allocation:
        return {}
    try:
        out = slurmcli.run(["squeue", "--steps", "-h", "-j", allocation, "-o", "%i|%j"], timeout=15)
    except slurmcli.SlurmError:
        return {}
    rows = {}
    for line in out.splitlines():
        step, _, name = line.strip().partition("|")
        if step:
            rows[step] = name
    return rows


def _served(argv: list[str], env: Mapping[str, str]) -> warmlaunch.Served | None:
    """`argv` forked by the warm launcher `env` names, its stdout and stderr on one pipe to this
    process, and as its stdin the read end of a pipe whose write end only this process holds
    (never inherited), open until this process ends: a served process is not this one's child,
    so instead of the parent-death signal it gets end-of-file there when the kernel is gone
    (notebook/tasks.py stops its ranks then). None when the launcher did not start it."""
    owner_read, owner_write = os.pipe()
    read_end, write_end = os.pipe()
    try:
        served, _ = warmlaunch.popen(argv, env, (owner_read, write_end, write_end))
    finally:
        os.close(owner_read)
        os.close(write_end)
    if served is None:
        os.close(owner_write)
        os.close(read_end)
        return None
    served.stdout = os.fdopen(read_end, "rb")
    for ended in [o for o in _OWNERS if o[0].poll() is not None]:  # (their supervisors are gone)
        _OWNERS.remove(ended)
        os.close(ended[1])
    _OWNERS.append((served, owner_write))
    return served


# Each served supervisor and the write end of its stdin: closed once it ended (at the next launch),
# else when this process ends. (A child this process forks without exec inherits it too, and holds
# the supervisor until it ends as well.)
_OWNERS: list[tuple[warmlaunch.Served, int]] = []


def _pdeathsig_shim(cmd: list[str]) -> list[str]:
    """Run `cmd` so that it gets SIGTERM if this (the caller's main) thread dies: a notebook kernel
    restart then cancels the launch instead of leaving it running. Only from the main thread (the
    death signal follows the thread that forked)."""
    if threading.current_thread() is not threading.main_thread() or not sys.platform.startswith("linux"):
        return cmd
    shim = (
        "import ctypes,os,signal,sys\n"
        "try:\n    ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))\nexcept Exception:\n    pass\n"
        "if os.getppid() != int(sys.argv[1]):\n    sys.exit(143)\n"
        "os.execvp(sys.argv[2], sys.argv[2:])"
    )
    return [sys.executable, "-c", shim, str(os.getpid()), *cmd]


_BY_EXECUTOR: dict[Executor, type[Backend]] = {Executor.SLURM: Slurm, Executor.LOCAL: Local, Executor.SRUN: SrunStep}


def for_attempt(attempt: Attempt) -> Backend:
    """The backend that watches and stops a recorded attempt (whoever queued it)."""
    return _BY_EXECUTOR[attempt.executor]()


def still_live(attempt: Attempt) -> bool:
    """Whether to keep waiting on an attempt: its backend says it is live, or Slurm cannot say
    (squeue and sacct already retried through an outage: the job may well still run)."""
    try:
        return for_attempt(attempt).is_live(attempt)
    except slurmcli.SlurmError:
        return True


def for_request(requested: launch.Requested) -> tuple[Backend, str]:
    """The backend a submit or resume queues on, with the one-line notice saying why
    (`launch.choose_executor`)."""
    chosen, notice = launch.choose_executor(requested)
    return (Slurm() if chosen is Executor.SLURM else Local()), notice


def requested_for(previous: Executor) -> launch.Requested:
    """A resume runs where the run ran, except a notebook's srun step, which needs an allocation."""
    return "slurm" if previous is Executor.SLURM else "local" if previous is Executor.LOCAL else "auto"
