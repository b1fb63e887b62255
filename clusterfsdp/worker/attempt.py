"""One rank's attempt, the torch-free half of the worker's entry point (worker/main.py): the
record of this incarnation (`RankAttempt`: its events, the failure it ends with and why), the
run's job.toml and environment as this rank applies them, its log, and what rank 0 decides
when a signal stopped training (requeue, follow-up job, stop). `rank.py`, the half that
imports torch, runs the attempt through these; `main.run` records its end.

Torch-free: `main` imports this before torch, and the notebook kernel imports `main`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from ..core import health, lock, outcomes, runfolder, secretenv, slurmcli
from ..core import spec as specmod
from ..core.budget import read_budget
from ..core.records import Cause, Event, EventKind, Executor, RankOutcome
from . import distenv, elastic, stopflags

if TYPE_CHECKING:  # they import torch
    from .heartbeat import Heartbeat
    from .metrics import MetricsWriter
    from .train import TrainState


LOCAL_REQUEUE_EXIT = 144  # submitit's local controller restarts the tasks on this exit code
ENV_LOG_ALL_RANKS = "CLUSTERFSDP_LOG_ALL_RANKS"  # "1": every rank prints progress (notebook all_ranks=True)


class Tee:
    """Write to the original stream and this rank's per-attempt log file."""

    def __init__(self, stream: IO[str], log: IO[str]):
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.log.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def _event(run: runfolder.RunFolder, env: distenv.DistEnv, kind: EventKind, **fields) -> None:
    run.append_event(Event(kind, env.job_id, env.restart, env.rank, socket.gethostname(), time.time(), **fields))


def _apply_env(spec: specmod.JobSpec, chosen: dict[str, str]) -> None:
    for key, value in chosen.items():
        if value != secretenv.REDACTED:  # secrets come from the inherited environment, never from files
            os.environ[key] = value


class PreflightFailed(RuntimeError):
    """A node failed a pre-flight check; raised on every rank (`nodes`: the ones that failed)."""

    def __init__(self, message: str, nodes: list[str]):
        super().__init__(message)
        self.nodes = nodes


@dataclass
class RankAttempt:
    """This rank's view of the incarnation it runs, for the failure record: the environment
    (the local executor's restart count is known only after the process group is up), the
    node's network facts, the Trainer's state once it exists, and what rank 0 holds: the
    attempt lock and the metrics sink (with the experiment trackers, closed with the attempt's
    outcome)."""

    run: runfolder.RunFolder
    env: distenv.DistEnv
    facts: dict[str, Any] = field(default_factory=dict)
    state: TrainState | None = None
    lock: lock.FileLock | None = None
    sink: MetricsWriter | None = None
    beat: Heartbeat | None = None
    grow: elastic.GrowWatch | None = None  # rank 0 of an elastic attempt below its largest size

    def event(self, kind: EventKind, **fields) -> None:
        _event(self.run, self.env, kind, **fields)

    def failed(self, e: BaseException) -> None:
        """Record the exception that ends this rank (its own view: a Python error, or a
        collective that lost its peer; control.outcomes weighs all ranks' views)."""
        reason = f"rank {self.env.rank} on {socket.gethostname()}: {type(e).__name__}: {e}"
        step = self.state.step if self.state is not None else None
        done = self.state.steps_run if self.state is not None else 0
        nodes = e.nodes if isinstance(e, PreflightFailed) else []
        self.event(EventKind.FAILED, reason=" ".join(reason.split())[:500], cause=failure_cause(e), step=step,
                   steps_done=done, failed_nodes=nodes)  # fmt: skip
        self.close_trackers(RankOutcome.FAILED)
        if self.lock is not None:
            self.lock.release()

    def close_trackers(self, outcome: RankOutcome) -> None:
        if self.sink is not None and self.sink.trackers is not None:
            self.sink.trackers.finish(outcome)
            self.sink.trackers = None


# What gloo and NCCL raise when a peer died, a connection broke or a collective timed out.
_COLLECTIVE = ("connection closed by peer", "connection reset by peer", "broken pipe", "timed out", "nccl",
               "gloo", "connection refused", "no route to host", "socket")  # fmt: skip


def failure_cause(e: BaseException) -> Cause:
    """COLLECTIVE for torch.distributed's own errors and the RuntimeErrors of a lost peer or a
    collective timeout (also inside a failed checkpoint save), PREFLIGHT for a node that failed
    the pre-flight, ERROR for everything else."""
    if isinstance(e, PreflightFailed):
        return Cause.PREFLIGHT
    dist = sys.modules.get("torch.distributed")
    dist_error = getattr(dist, "DistError", None) if dist is not None else None
    if dist_error is not None and isinstance(e, dist_error):
        return Cause.COLLECTIVE
    text = str(e).lower()
    if isinstance(e, RuntimeError) and any(word in text for word in _COLLECTIVE):
        return Cause.COLLECTIVE
    return Cause.ERROR


def sized_spec(spec: specmod.JobSpec, env: distenv.DistEnv) -> specmod.JobSpec:
    """The spec as this attempt runs it: with a node range, on the nodes Slurm allocated
    (SLURM_JOB_NUM_NODES) with the grad_accum that keeps the global batch; a count as it is. The
    ranks must be what that size makes, or the losses would be silently wrong."""
    if not spec.node_range.elastic:
        return spec
    nodes = slurmcli.allocation_nodes() or env.num_nodes
    sized = spec.on_nodes(nodes)
    if (env.num_nodes, env.world_size) != (nodes, sized.world_size):
        raise RuntimeError(
            f"the job step has {env.world_size} ranks on {env.num_nodes} node(s), but the allocation's {nodes} "
            f"node(s) x {sized.tasks_per_node} make {sized.world_size}"
        )
    return sized


def load_spec(attempt: RankAttempt) -> specmod.JobSpec:
    """The run's job.toml, and the environment it asks for: the network choices of this node
    (distenv), [env] on top, then the torch.distributed variables."""
    spec = specmod.load(attempt.run.job_toml)
    env = attempt.env  # the local executor's restart count is known later: its flight records go to <job>.0
    diagnostics = health.diagnostics_dir(attempt.run.path, env.job_id, env.restart)
    chosen, attempt.facts = distenv.network_env(env, spec.env, diagnostics=diagnostics)
    _apply_env(spec, chosen)
    if "MASTER_PORT" in spec.env:  # the job's own port (what a taken port's error says to set) wins
        attempt.env = distenv.DistEnv(**{**env.__dict__, "master_port": int(spec.env["MASTER_PORT"])})
    os.environ.update(attempt.env.export())
    return spec


def tee_output(attempt: RankAttempt) -> Callable[[str], None]:
    """This rank's stdout and stderr also into logs/<job>.<restart>/rank<R>.log; returns the
    progress log (rank 0's, or every rank's in a notebook with all_ranks=True)."""
    env = attempt.env
    log_path = attempt.run.log_path(env.job_id, env.restart, env.rank)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = open(log_path, "a", buffering=1)  # noqa: SIM115 - stays open for the rest of the process
    sys.stdout, sys.stderr = Tee(sys.__stdout__ or log_file, log_file), Tee(sys.__stderr__ or log_file, log_file)
    every_rank = os.environ.get(ENV_LOG_ALL_RANKS) == "1"

    def log(msg: str) -> None:
        if env.rank == 0 or every_rank:
            print(f"[rank{env.rank}] {msg}", flush=True)

    return log


def untee() -> None:
    """Stop copying stdout and stderr into the rank's log. The traceback is in it once: the
    exception, raised on, is printed again on the way out (by torch.distributed's excepthook,
    each line prefixed `[rankN]:`), which now goes to submitit's task log alone, so that
    `--follow` and `logs` show a one-line error's traceback once, not twice."""
    sys.stdout.flush()
    sys.stderr.flush()
    if isinstance(sys.stdout, Tee):
        sys.stdout = sys.stdout.stream
    if isinstance(sys.stderr, Tee):
        sys.stderr = sys.stderr.stream


def record_start(attempt: RankAttempt) -> None:
    """Rank 0: the `start` event (and the attempt itself when someone ran sbatch.sh by hand)."""
    run, env = attempt.run, attempt.env
    if env.rank != 0:
        return
    record = run.record()
    if env.launcher == "slurm" and record.dry_run and record.attempt(env.job_id) is None:
        run.add_attempt(env.job_id, Executor.SLURM, "submitted by hand (sbatch)")
    number = attempt.sink.attempt if attempt.sink is not None else None
    attempt.event(EventKind.START, world_size=env.world_size, nodes=env.num_nodes, attempt=number)


def stop_verdict(attempt: RankAttempt, signal_name: str) -> outcomes.StopVerdict:
    """Why the ranks stopped. Under Slurm rank 0 asks `scontrol show job` (SIGTERM is both a
    cancel and a preemption); the local executor has no preemption: SIGUSR2 is its time limit,
    SIGTERM a cancel."""
    env = attempt.env
    if signal_name == stopflags.GROW:  # (rank 0's own finding; a cancel asked meanwhile still stops)
        last = attempt.run.record().attempt(env.job_id)
        if last is not None and last.cancelled is not None:
            return outcomes.StopVerdict(outcomes.StopAction.STOP, Cause.CANCELLED, "cancelled (clusterfsdp cancel)")
        why = attempt.grow.reason if attempt.grow is not None else "more nodes free"
        return outcomes.StopVerdict(outcomes.StopAction.REQUEUE, Cause.GROW, why)
    if signal_name == stopflags.BUDGET:
        budget = read_budget(attempt.run)
        why = budget.reason() if budget else "slurm.max_gpu_hours used up"
        return outcomes.StopVerdict(outcomes.StopAction.STOP, Cause.BUDGET, why)
    if env.launcher != "slurm":
        if signal_name == "SIGUSR2":
            return outcomes.StopVerdict(outcomes.StopAction.REQUEUE, Cause.TIME_LIMIT, "SIGUSR2 (time limit)")
        return outcomes.StopVerdict(outcomes.StopAction.STOP, Cause.CANCELLED, "cancelled (SIGTERM)")
    last = attempt.run.record().attempt(env.job_id)
    cancel_asked = last is not None and last.cancelled is not None
    try:
        job = slurmcli.show_job(env.job_id, retry_s=slurmcli.retry_budget_s())  # worth waiting for
    except slurmcli.SlurmError:
        job = None
    return outcomes.classify_stop(signal_name, job, env.restart, cancel_asked)


def come_back(attempt: RankAttempt, verdict: outcomes.StopVerdict, log) -> None:
    """Slurm: requeue this job (it keeps its id); where Slurm refuses (--no-requeue, a job that
    is already ending) a follow-up job takes over once this one ends (Run.come_back). The run
    service stands above the worker: it is called across a process boundary (control/jobstep.py
    `come-back`), as the batch script calls it."""
    env = attempt.env
    if verdict.action is outcomes.StopAction.EXIT:
        log("Slurm requeues this job itself; the next incarnation resumes")
        return
    how = "requeue" if verdict.action is outcomes.StopAction.REQUEUE else "follow-up"
    argv = [sys.executable, "-m", "clusterfsdp.control.jobstep", "come-back", str(attempt.run.path), env.job_id,
            str(env.restart), verdict.cause.value, how]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise RuntimeError(f"bringing job {env.job_id} back failed: {lines[-1] if lines else done.returncode}")
    if done.stdout.strip():
        followed = json.loads(done.stdout.strip().splitlines()[-1])
        attempt.event(EventKind.FOLLOW_UP, job_id_next=followed["job_id_next"], reason=followed["why"],
                      cause=verdict.cause)  # fmt: skip
