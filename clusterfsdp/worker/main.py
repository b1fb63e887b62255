"""The process that runs on every rank: `python -m clusterfsdp.worker RUN_DIR`, or the
callable `run(RUN_DIR)` that submitit pickles. Reads the run's job.toml, sets up
torch.distributed from Slurm's (or the local executor's) environment, trains, and records
start / end / requeue events in the run folder.

torch is imported inside `run`, so importing this module (as the CLI does to reference the
callable for submitit) costs nothing.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

from ..control import lock, runfolder, secretenv
from ..control import spec as specmod
from ..control.records import Event, EventKind, Executor
from . import distenv
from .stopflags import StopFlags

if TYPE_CHECKING:  # both import torch; `run` imports them once it has installed the signal flags
    from .metrics import MetricsWriter
    from .trackers import Trackers

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


def run(run_dir: str) -> str:
    """Train on this rank; returns the outcome ('completed', 'stopped') or exits for a requeue."""
    flags = StopFlags()  # first: a signal during the imports below must not be lost
    # Compute nodes never download: submit resolved every hub id to a local snapshot folder
    # (set before huggingface_hub is imported; [env] may still override it).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import torch.distributed as dist

    from . import metrics, train

    run = runfolder.RunFolder(Path(run_dir))
    spec = specmod.load(run.job_toml)
    env = distenv.from_environ()
    chosen, facts = distenv.network_env(env, spec.env)
    _apply_env(spec, chosen)
    os.environ.update(env.export())

    if torch.cuda.is_available():
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    from datetime import timedelta

    dist.init_process_group(backend, timeout=timedelta(minutes=10), device_id=device if backend == "nccl" else None)
    if env.launcher == "submitit-local":  # Slurm counts restarts; the local executor does not
        count = torch.tensor([sum(1 for e in run.events(env.job_id) if e.event is EventKind.START)])
        dist.broadcast(count, 0)
        env = distenv.DistEnv(**{**env.__dict__, "restart": int(count)})

    log_path = run.log_path(env.job_id, env.restart, env.rank)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = open(log_path, "a", buffering=1)  # noqa: SIM115 - stays open for the rest of the process
    sys.stdout = Tee(cast(IO[str], sys.__stdout__), log_file)
    sys.stderr = Tee(cast(IO[str], sys.__stderr__), log_file)

    every_rank = os.environ.get(ENV_LOG_ALL_RANKS) == "1"

    def log(msg: str) -> None:
        if env.rank == 0 or every_rank:
            print(f"[rank{env.rank}] {msg}", flush=True)

    attempt_lock: lock.FileLock | None = None
    sink: MetricsWriter | None = None
    try:
        verdict = torch.zeros(1)  # rank 0 tells the others whether this attempt may train
        if env.rank == 0:
            try:
                attempt_lock = _attempt_lock(run, env)
                attempt = sum(1 for e in run.events() if e.event is EventKind.START)
                sink = metrics.MetricsWriter(run.metrics_file, attempt, _trackers(run, spec, attempt, log))
            except BaseException:
                verdict.fill_(1)
                raise
            finally:
                dist.broadcast(verdict, 0)
        else:
            dist.broadcast(verdict, 0)
            if verdict.item():
                raise RuntimeError("rank 0 did not start this attempt (see its log); not starting")
        if env.local_rank == 0:
            distenv.write_node_record(
                run.node_record(env.job_id, env.restart, socket.gethostname()),
                env,
                facts,
                {
                    "backend": backend,
                    "device": str(device),
                    "torch": torch.__version__,
                    "nccl": _nccl_version() if backend == "nccl" else "",
                    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                    "python": sys.version.split()[0],
                },
            )
        if env.rank == 0:
            record = run.record()
            if env.launcher == "slurm" and record.dry_run and record.attempt(env.job_id) is None:
                run.add_attempt(env.job_id, Executor.SLURM, "submitted by hand (sbatch)")
            _event(
                run, env, EventKind.START, world_size=env.world_size, nodes=env.num_nodes, attempt=sink and sink.attempt
            )
        log(
            f"{env.world_size} ranks on {env.num_nodes} node(s), backend {backend}, master "
            f"{env.master_addr}:{env.master_port}, job {env.job_id} restart {env.restart}"
        )
        outcome = train.train(
            spec,
            device,
            env.rank,
            env.world_size,
            run.checkpoints_dir(spec),
            run.job_toml.read_text(),
            log,
            sink,
            lambda event, **f: _event(run, env, event, **f) if env.rank == 0 else None,
            flags,
            run.model_dir,
        )
    except BaseException as e:
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        reason = f"rank {env.rank} on {socket.gethostname()}: {type(e).__name__}: {e}"
        _event(run, env, EventKind.FAILED, reason=reason[:500])
        _finish(sink, "failed")
        if attempt_lock is not None:
            attempt_lock.release()
        raise
    finally:
        sys.stdout.flush()
    _finish(sink, outcome.status)
    if outcome.status == "preempted":
        _requeue(run, spec, env, attempt_lock)  # exits
    if env.rank == 0:
        _event(
            run,
            env,
            EventKind.COMPLETED if outcome.status == "completed" else EventKind.STOPPED,
            step=outcome.step,
            checkpoint=outcome.checkpoint,
            reason="" if outcome.status == "completed" else f"cancelled (SIGTERM); saved step {outcome.step}",
        )
    if attempt_lock is not None:
        attempt_lock.release()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return outcome.status


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


def _finish(sink: MetricsWriter | None, outcome: str) -> None:
    if sink is not None and sink.trackers is not None:
        sink.trackers.finish(outcome)


def _requeue(
    run: runfolder.RunFolder, spec: specmod.JobSpec, env: distenv.DistEnv, attempt_lock: lock.FileLock | None
) -> None:
    """After the collective save: rank 0 requeues (Slurm) or all ranks exit 144 (local executor).
    Restarts are bounded by slurm.max_restarts over the whole run."""
    import torch.distributed as dist

    from ..control import slurmcli
    from ..control.run import Run

    done = sum(1 for e in run.events() if e.event is EventKind.REQUEUED)
    if env.rank == 0:
        if done >= spec.slurm.max_restarts:
            limit = spec.slurm.max_restarts
            reason = f"interrupted again after {done} restarts (slurm.max_restarts = {limit})"
            _event(run, env, EventKind.FAILED, reason=reason)
        elif env.launcher == "slurm":
            _event(run, env, EventKind.REQUEUED, reason="SIGUSR2 (time limit or preemption)", restarts=done + 1)
            try:
                slurmcli.requeue(env.job_id)
            except slurmcli.SlurmError as e:  # JobRequeue=0 or a non-batch job: a follow-up job resumes
                sub = Run(run).follow_up(spec, f"follow-up: requeue refused ({e})", f"afterany:{env.job_id}")
                _event(run, env, EventKind.FOLLOW_UP, job_id_next=sub.job_id, reason=str(e))
        else:
            _event(run, env, EventKind.REQUEUED, reason="SIGUSR2 (time limit or preemption)", restarts=done + 1)
        if attempt_lock is not None:
            attempt_lock.release()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    if done >= spec.slurm.max_restarts:
        sys.exit(1)
    sys.exit(LOCAL_REQUEUE_EXIT if env.launcher == "submitit-local" else 0)
