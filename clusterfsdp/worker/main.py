"""The process that runs on every rank: `python -m clusterfsdp.worker RUN_DIR`, or the
callable `run(RUN_DIR)` that submitit pickles. Reads the run's job.toml, sets up
torch.distributed from Slurm's (or the local executor's) environment, trains, and records
start / end / requeue events in the run folder.

torch is imported inside `run`, so importing this module (as the CLI does to reference the
callable for submitit) costs nothing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..core import health, lock, outcomes, retrynotes, runfolder, secretenv, slurmcli
from ..core import spec as specmod
from ..core.budget import read_budget
from ..core.outcomes import RankOutcome
from ..core.records import Cause, Event, EventKind, Executor
from ..core.spec import benchmetric
from . import distenv, elastic, preflight, stopflags
from .stopflags import StopFlags

if TYPE_CHECKING:  # both import torch; `run` imports them once it has installed the signal flags
    from .heartbeat import Heartbeat
    from .metrics import MetricsWriter
    from .trackers import Trackers
    from .train import Outcome, TrainState

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


# Rank 0 of the attempt that trains holds the run's attempt lock, refreshed every HEARTBEAT_S, so
# that a second attempt started beside it (a hand-submitted sbatch.sh, a resume that raced past
# the control plane's checks) stops before touching checkpoints or metrics. A lock left by a
# previous incarnation of the same job (Slurm requeue, local restart) is taken over at once; one
# left by a dead host is stale after STALE_S without a heartbeat.
HEARTBEAT_S, STALE_S = 15.0, 90.0


def _attempt_lock(run: runfolder.RunFolder, env: distenv.DistEnv) -> lock.FileLock:
    same_job = f"job {env.job_id} "
    held = lock.FileLock(
        run.attempt_lock_file,
        f"job {env.job_id} restart {env.restart}",
        stale_after_s=STALE_S,
        heartbeat_s=HEARTBEAT_S,
        takeover=lambda owner: owner.purpose.startswith(same_job),
    )
    try:
        return held.acquire(timeout_s=STALE_S + 2 * HEARTBEAT_S, wait_for_live=False)
    except lock.LockHeld as e:
        who = e.owner.describe() if e.owner else "another attempt"
        raise RuntimeError(f"another attempt is training in this run folder ({who}); not starting a second") from None


def _apply_env(spec: specmod.JobSpec, chosen: dict[str, str]) -> None:
    for key, value in chosen.items():
        if value != secretenv.REDACTED:  # secrets come from the inherited environment, never from files
            os.environ[key] = value


@dataclass
class _Attempt:
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
        nodes = e.nodes if isinstance(e, preflight.PreflightFailed) else []
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
    if isinstance(e, preflight.PreflightFailed):
        return Cause.PREFLIGHT
    dist = sys.modules.get("torch.distributed")
    dist_error = getattr(dist, "DistError", None) if dist is not None else None
    if dist_error is not None and isinstance(e, dist_error):
        return Cause.COLLECTIVE
    text = str(e).lower()
    if isinstance(e, RuntimeError) and any(word in text for word in _COLLECTIVE):
        return Cause.COLLECTIVE
    return Cause.ERROR


def run(run_dir: str) -> RankOutcome:
    """Train on this rank; returns the outcome (COMPLETED, STOPPED) or exits (a requeue, a
    restart of the local executor, restarts used up). Every exception is recorded as a `failed` event first."""
    flags = StopFlags()  # first: a signal during the imports below must not be lost
    # Compute nodes never download: submit resolved every hub id to a local snapshot folder
    # (set before huggingface_hub is imported; [env] may still override it).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    attempt = _Attempt(runfolder.RunFolder(Path(run_dir)), distenv.from_environ())
    try:
        return _train(attempt, flags)
    except SystemExit:
        raise
    except BaseException as e:
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        attempt.failed(e)
        _untee()
        raise
    finally:
        if attempt.beat is not None:
            attempt.beat.close()
        sys.stdout.flush()


def _train(attempt: _Attempt, flags: StopFlags) -> RankOutcome:
    """The rank's set-up, in named steps, then the Trainer and what its end means."""
    from . import train

    spec = _load_spec(attempt)
    sized = _sized(spec, attempt.env)  # a node range: this allocation's size (the job file's spec acts on the run)
    watch = health.WatchdogSettings.of(spec.train.watchdog)
    device, backend = _init_process_group(attempt, health.collective_timeout_s(watch, health.Phase.START_UP, 0))
    log = _tee_output(attempt)
    _note_warm_start(attempt, log)
    _start_heartbeat(attempt, watch)
    retrynotes.report_retries(log)
    _admit(attempt, spec, log)
    _set_threads(attempt, log)
    _record_node(attempt, device, backend)
    if spec.slurm.preflight:
        preflight.run(sized, attempt.run, attempt.env, device, log)
    _record_start(attempt)
    env, run = attempt.env, attempt.run
    log(
        f"{env.world_size} ranks on {env.num_nodes} node(s), backend {backend}, master "
        f"{env.master_addr}:{env.master_port}, job {env.job_id} restart {env.restart}"
    )
    if sized is not spec:
        log(f"slurm.nodes = {spec.slurm.nodes!r}: on {sized.slurm.nodes} node(s) with train.grad_accum = "
            f"{sized.train.grad_accum} (global batch {sized.global_batch})")  # fmt: skip
    ctx = train.RankContext(
        sized,
        device,
        env.rank,
        env.world_size,
        run.checkpoints_dir(spec),
        run.job_toml.read_text(),
        run.model_dir,
        log,
        lambda event, **f: attempt.event(event, **f) if env.rank == 0 else None,
        attempt.sink,
        flags,
        attempt.beat,
    )
    trainer = train.Trainer(ctx)
    queue = None
    if env.rank == 0 and spec.benchmarks.tasks and spec.benchmarks.every_checkpoints > 0:
        from .benchqueue import BenchQueue

        trainer.checkpointer.on_complete = queue = BenchQueue(run, spec, env.launcher, log)
    if benchmetric.is_bench(spec.train.early_stopping.metric):  # every rank asks, rank 0 reads the results
        from .benchstop import BenchStop

        trainer.bench_stop = BenchStop(spec, run if env.rank == 0 else None, trainer.flag_group)
    trainer.budget = read_budget(run) if spec.slurm.max_gpu_hours > 0 else None  # (jobstep wrote it)
    if env.rank == 0 and env.launcher == "slurm":  # a node range below its largest size: grow when nodes free up
        trainer.grow = attempt.grow = elastic.watch(spec, env.job_id, env.num_nodes, run.events())
    attempt.state = trainer.state
    try:
        outcome = trainer.run()
    finally:
        if attempt.grow is not None:
            attempt.grow.close()
        if queue is not None:  # the evaluation jobs still being queued (Slurm): before the step ends
            queue.settle()
    if attempt.beat is not None:  # training is over: what follows may wait on Slurm, unwatched
        attempt.beat.phase(health.Phase.DONE)
    if outcome.end is train.LoopEnd.INTERRUPTED:
        return _interrupted(attempt, spec, outcome, log)
    return _end(
        attempt, EventKind.COMPLETED, step=outcome.step, checkpoint=outcome.checkpoint, cause=Cause.COMPLETED,
        reason=outcome.reason,
    )  # fmt: skip


def _sized(spec: specmod.JobSpec, env: distenv.DistEnv) -> specmod.JobSpec:
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


def _load_spec(attempt: _Attempt) -> specmod.JobSpec:
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


def group_backends(backend: str) -> str:
    """The default group's backends: on GPUs NCCL for CUDA tensors and gloo for CPU ones.

    The control collectives (the attempt's admission verdict, the local restart count, stop
    flags, eval totals) move small CPU tensors, which an NCCL-only group refuses ("No backend
    type associated with device type cpu"): every GPU run failed at `_admit` until a device
    call found it (bench/device_run.sh, 2026-11-28). Model collectives stay on NCCL."""
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


def _init_process_group(attempt: _Attempt, timeout_s: float):
    """The device (this node's GPU by local rank, else CPU) and the default process group
    (NCCL on GPUs with gloo beside it for CPU tensors, gloo on CPUs), its timeout the
    watchdog's start-up rule (the heartbeat follows the phases and the step time later). Rank 0
    hosts the rendezvous on the master port: one another process holds stops it with what to
    set (distenv.MasterPortInUse). The local executor's restart count is counted from the
    `start` events and agreed on here (Slurm counts restarts itself)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        device = torch.device("cuda", attempt.env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
        trace = os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
        if trace:  # where the flight recorder dumps (distenv.network_env)
            Path(trace).parent.mkdir(parents=True, exist_ok=True)
    else:
        device, backend = torch.device("cpu"), "gloo"
    timeout = timedelta(seconds=timeout_s)
    env = attempt.env
    if env.rank == 0 and distenv.port_taken(env.master_port):  # rank 0 hosts the rendezvous store
        raise distenv.master_port_problem(env.master_port)
    try:
        dist.init_process_group(
            group_backends(backend), timeout=timeout, device_id=device if backend == "nccl" else None
        )
    except RuntimeError as e:  # taken between the check and the bind
        if env.rank == 0 and "EADDRINUSE" in str(e):
            raise distenv.master_port_problem(env.master_port) from e
        raise
    if env.launcher == "submitit-local":
        count = torch.tensor([sum(1 for e in attempt.run.events(env.job_id) if e.event is EventKind.START)])
        dist.broadcast(count, 0)
        attempt.env = distenv.DistEnv(**{**env.__dict__, "restart": int(count)})
    return device, backend


def _start_heartbeat(attempt: _Attempt, settings: health.WatchdogSettings) -> None:
    """This rank's heartbeat, and on each node's first rank the node's watchdog (train.watchdog)."""
    from . import heartbeat

    if not settings.enabled:
        return
    env, run = attempt.env, attempt.run
    log = run.log_path(env.job_id, env.restart, env.rank)
    attempt.beat = heartbeat.Heartbeat(run.path, env.job_id, env.restart, env.rank, settings, log)
    if env.local_rank == 0:
        heartbeat.start_node_watchdog(run.path, env.job_id, env.restart, env.world_size, settings)


def _tee_output(attempt: _Attempt) -> Callable[[str], None]:
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


def _untee() -> None:
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


def _admit(attempt: _Attempt, spec: specmod.JobSpec, log: Callable[[str], None]) -> None:
    """Rank 0 takes the attempt lock and opens the metrics sink (with the trackers), then tells
    the other ranks whether this attempt may train."""
    import torch
    import torch.distributed as dist

    from . import metrics

    run, env = attempt.run, attempt.env
    verdict = torch.zeros(1)
    if env.rank == 0:
        try:
            attempt.lock = _attempt_lock(run, env)
            number = sum(1 for e in run.events() if e.event is EventKind.START)
            attempt.sink = metrics.MetricsWriter(run.metrics_file, number, _trackers(run, spec, number, log))
        except BaseException:
            verdict.fill_(1)
            raise
        finally:
            dist.broadcast(verdict, 0)
    else:
        dist.broadcast(verdict, 0)
        if verdict.item():
            raise RuntimeError("rank 0 did not start this attempt (see its log); not starting")


def _note_warm_start(attempt: _Attempt, log: Callable[[str], None]) -> None:
    """Whether this rank was forked from a launcher that had imported torch and transformers
    (worker/warmstart.py), in the log and the node record."""
    from . import warmstart

    attempt.facts["warm_start"] = warmstart.launcher is not None
    if warmstart.launcher is not None:
        log(f"warm start: forked from pid {warmstart.launcher}, which imported torch and transformers "
            f"in {warmstart.preload_s:.1f} s")  # fmt: skip


def _set_threads(attempt: _Attempt, log: Callable[[str], None]) -> None:
    """Each rank's share of its machine's CPUs for torch's own threads (threads.py; collective)."""
    from . import threads

    count, why = threads.apply()
    attempt.facts["cpu_threads"] = count
    log(f"cpu threads per rank: {count} ({why})")


def _record_node(attempt: _Attempt, device, backend: str) -> None:
    """The first rank of each node records the node's choices under nodes/."""
    import torch

    env = attempt.env
    if env.local_rank != 0:
        return
    distenv.write_node_record(
        attempt.run.node_record(env.job_id, env.restart, socket.gethostname()),
        env,
        attempt.facts,
        {
            "backend": backend,
            "device": str(device),
            "torch": torch.__version__,
            "nccl": _nccl_version() if backend == "nccl" else "",
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "python": sys.version.split()[0],
        },
    )


def _record_start(attempt: _Attempt) -> None:
    """Rank 0: the `start` event (and the attempt itself when someone ran sbatch.sh by hand)."""
    run, env = attempt.run, attempt.env
    if env.rank != 0:
        return
    record = run.record()
    if env.launcher == "slurm" and record.dry_run and record.attempt(env.job_id) is None:
        run.add_attempt(env.job_id, Executor.SLURM, "submitted by hand (sbatch)")
    number = attempt.sink.attempt if attempt.sink is not None else None
    attempt.event(EventKind.START, world_size=env.world_size, nodes=env.num_nodes, attempt=number)


def _nccl_version() -> str:
    from torch.cuda import nccl

    return ".".join(map(str, nccl.version()))


def _trackers(
    run: runfolder.RunFolder, spec: specmod.JobSpec, attempt: int, log: Callable[[str], None]
) -> Trackers | None:
    """Rank 0's experiment trackers (none configured: None, and no tracker package is imported)."""
    if not spec.log.trackers:
        return None
    from .trackers import Trackers

    return Trackers.open(run, spec, attempt, log)


def _end(attempt: _Attempt, kind: EventKind, **fields) -> RankOutcome:
    """Rank 0 records how the attempt ended; every rank then ends its part as that record means
    (outcomes.ENDS: the same word on each level)."""
    if attempt.env.rank == 0:
        attempt.event(kind, **fields)
    _finish(attempt, outcomes.RANK_END[kind])
    return outcomes.RANK_END[kind]


def _finish(attempt: _Attempt, outcome: RankOutcome) -> None:
    """End this rank's part: close the trackers with `outcome`, release the lock, leave the group."""
    import torch.distributed as dist

    attempt.close_trackers(outcome)
    if attempt.lock is not None:
        attempt.lock.release()
        attempt.lock = None
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()


def _verdict(attempt: _Attempt, signal_name: str) -> outcomes.StopVerdict:
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


def _interrupted(attempt: _Attempt, spec: specmod.JobSpec, outcome: Outcome, log) -> RankOutcome:
    """After the collective save a signal triggered: rank 0 records why and brings the job
    back (requeue, follow-up job) or stops it; the local executor restarts on exit code 144.
    Comebacks are bounded by slurm.max_restarts when they made no progress (outcomes.restarts_used)."""
    env, run = attempt.env, attempt.run
    local = env.launcher == "submitit-local"
    verdict = _verdict(attempt, outcome.signal) if env.rank == 0 or local else None
    if verdict is None:  # Slurm, rank > 0: rank 0 acts
        _finish(attempt, RankOutcome.PREEMPTED)
        sys.exit(0)
    saved = f"saved step {outcome.step}"
    if verdict.action is outcomes.StopAction.STOP:
        return _end(attempt, EventKind.STOPPED, step=outcome.step, checkpoint=outcome.checkpoint,
                    cause=verdict.cause, reason=f"{verdict.reason}; {saved}")  # fmt: skip
    cost = outcomes.charge(run.events(), env.job_id, env.restart, outcome.step)
    if cost.exhausted(spec.slurm.max_restarts):
        reason = (f"{verdict.reason}; {saved}, no progress since the last restart, and {cost.used} restarts used "
                  f"(slurm.max_restarts = {spec.slurm.max_restarts})")  # fmt: skip
        _end(attempt, EventKind.FAILED, step=outcome.step, cause=Cause.RESTARTS_EXHAUSTED, reason=reason)
        sys.exit(1)
    if env.rank == 0:
        attempt.event(EventKind.REQUEUED, step=outcome.step, checkpoint=outcome.checkpoint, cause=verdict.cause,
                      reason=f"{verdict.reason}; {saved}", restarts=cost.after())  # fmt: skip
        if env.launcher == "slurm":
            _come_back(attempt, verdict, log)
    _finish(attempt, outcomes.RANK_END[EventKind.REQUEUED])
    sys.exit(LOCAL_REQUEUE_EXIT if local else 0)


def _come_back(attempt: _Attempt, verdict: outcomes.StopVerdict, log) -> None:
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
