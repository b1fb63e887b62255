"""What a rank does once torch is imported (worker/main.py imports this module after it has
installed the stop flags and applied HF_HUB_OFFLINE and the job's [env]): the process group, this rank's heartbeat and
threads, rank 0's admission (the attempt lock, the metrics sink and trackers), the node record,
the pre-flight, the Trainer, and how the attempt ends (completed, stopped, requeued).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.cuda import nccl

from ..core import health, lock, outcomes, retrynotes, runfolder
from ..core import spec as specmod
from ..core.budget import read_budget
from ..core.records import RANK_END, Cause, EventKind, RankOutcome
from ..core.spec import benchmetric
from . import distenv, elastic, heartbeat, metrics, preflight, threads, train, warmstart
from .attempt import (
    LOCAL_REQUEUE_EXIT,
    RankAttempt,
    come_back,
    record_start,
    sized_spec,
    stop_verdict,
    tee_output,
)
from .benchqueue import BenchQueue
from .benchstop import BenchStop
from .stopflags import StopFlags
from .trackers import Trackers

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


def train_rank(attempt: RankAttempt, flags: StopFlags, spec: specmod.JobSpec) -> RankOutcome:
    """The rank's set-up, in named steps, then the Trainer and what its end means. `spec`: the
    run's job.toml, its environment already applied (`attempt.load_spec`, before torch)."""
    sized = sized_spec(spec, attempt.env)  # a node range: this allocation's size (the job file's spec acts on the run)
    watch = health.WatchdogSettings.of(spec.train.watchdog)
    device, backend = init_process_group(attempt, health.collective_timeout_s(watch, health.Phase.START_UP, 0))
    log = tee_output(attempt)
    _note_warm_start(attempt, log)
    _start_heartbeat(attempt, watch)
    retrynotes.report_retries(log)
    _admit(attempt, spec, log)
    _set_threads(attempt, log)
    _record_node(attempt, device, backend)
    if spec.slurm.preflight:
        preflight.run(sized, attempt.run, attempt.env, device, log)
    record_start(attempt)
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
        trainer.checkpointer.on_complete = queue = BenchQueue(run, spec, env.launcher, log)
    if benchmetric.is_bench(spec.train.early_stopping.metric):  # every rank asks, rank 0 reads the results
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


def group_backends(backend: str) -> str:
    """The default group's backends: on GPUs NCCL for CUDA tensors and gloo for CPU ones.

    The control collectives (the attempt's admission verdict, the local restart count, stop
    flags, eval totals) move small CPU tensors, which an NCCL-only group refuses ("No backend
    type associated with device type cpu"): every GPU run failed at `_admit` until a device
    call found it (bench/device_run.sh, 2026-11-28). Model collectives stay on NCCL."""
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


def init_process_group(attempt: RankAttempt, timeout_s: float):
    """The device (this node's GPU by local rank, else CPU) and the default process group
    (NCCL on GPUs with gloo beside it for CPU tensors, gloo on CPUs), its timeout the
    watchdog's start-up rule (the heartbeat follows the phases and the step time later). Rank 0
    hosts the rendezvous on the master port: one another process holds stops it with what to
    set (distenv.MasterPortInUse). The local executor's restart count is counted from the
    `start` events and agreed on here (Slurm counts restarts itself)."""
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


def _start_heartbeat(attempt: RankAttempt, settings: health.WatchdogSettings) -> None:
    """This rank's heartbeat, and on each node's first rank the node's watchdog (train.watchdog)."""
    if not settings.enabled:
        return
    env, run = attempt.env, attempt.run
    log = run.log_path(env.job_id, env.restart, env.rank)
    attempt.beat = heartbeat.Heartbeat(run.path, env.job_id, env.restart, env.rank, settings, log)
    if env.local_rank == 0:
        heartbeat.start_node_watchdog(run.path, env.job_id, env.restart, env.world_size, settings)


def _admit(attempt: RankAttempt, spec: specmod.JobSpec, log: Callable[[str], None]) -> None:
    """Rank 0 takes the attempt lock and opens the metrics sink (with the trackers), then tells
    the other ranks whether this attempt may train."""
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


def _note_warm_start(attempt: RankAttempt, log: Callable[[str], None]) -> None:
    """Whether this rank was forked from a launcher that had imported torch and transformers
    (worker/warmstart.py), in the log and the node record."""
    attempt.facts["warm_start"] = warmstart.launcher is not None
    if warmstart.launcher is not None:
        log(f"warm start: forked from pid {warmstart.launcher}, which imported torch and transformers "
            f"in {warmstart.preload_s:.1f} s")  # fmt: skip


def _set_threads(attempt: RankAttempt, log: Callable[[str], None]) -> None:
    """Each rank's share of its machine's CPUs for torch's own threads (threads.py; collective)."""
    count, why = threads.apply()
    attempt.facts["cpu_threads"] = count
    log(f"cpu threads per rank: {count} ({why})")


def _record_node(attempt: RankAttempt, device, backend: str) -> None:
    """The first rank of each node records the node's choices under nodes/."""
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


def _nccl_version() -> str:
    return ".".join(map(str, nccl.version()))


def _trackers(
    run: runfolder.RunFolder, spec: specmod.JobSpec, attempt: int, log: Callable[[str], None]
) -> Trackers | None:
    """Rank 0's experiment trackers (none configured: None, and no tracker package is imported)."""
    if not spec.log.trackers:
        return None
    return Trackers.open(run, spec, attempt, log)


def _end(attempt: RankAttempt, kind: EventKind, **fields) -> RankOutcome:
    """Rank 0 records how the attempt ended; every rank then ends its part as that record means
    (records.ENDS: the same word on each level)."""
    if attempt.env.rank == 0:
        attempt.event(kind, **fields)
    _finish(attempt, RANK_END[kind])
    return RANK_END[kind]


def _finish(attempt: RankAttempt, outcome: RankOutcome) -> None:
    """End this rank's part: close the trackers with `outcome`, release the lock, leave the group."""
    attempt.close_trackers(outcome)
    if attempt.lock is not None:
        attempt.lock.release()
        attempt.lock = None
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()


def _interrupted(attempt: RankAttempt, spec: specmod.JobSpec, outcome: train.Outcome, log) -> RankOutcome:
    """After the collective save a signal triggered: rank 0 records why and brings the job
    back (requeue, follow-up job) or stops it; the local executor restarts on exit code 144.
    Comebacks are bounded by slurm.max_restarts when they made no progress (outcomes.restarts_used)."""
    env, run = attempt.env, attempt.run
    local = env.launcher == "submitit-local"
    verdict = stop_verdict(attempt, outcome.signal) if env.rank == 0 or local else None
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
            come_back(attempt, verdict, log)
    _finish(attempt, RANK_END[EventKind.REQUEUED])
    sys.exit(LOCAL_REQUEUE_EXIT if local else 0)
