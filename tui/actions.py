"""What the TUI changes in the world: submit, resume, cancel. Blocking calls, run in workers.

They go through `clusterfsdp.launch` like the CLI does. One difference: the TUI owns the
terminal it draws on (or, under textual-serve, the pipe to the browser), and the local
executor forks a controller that would inherit it; children forked while the TUI submits get
/dev/null as stdio instead, so a stray warning cannot scribble over the screen and a
controller that outlives the app cannot hold a web session's pipe open.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from clusterfsdp.control import ckptfolder, launch, runfolder
from clusterfsdp.control import spec as specmod

from .queue_rows import QueueRow, Slurm

_lock = threading.Lock()
_submitting = 0


def _detach_stdio_in_child() -> None:
    if _submitting:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)


os.register_at_fork(after_in_child=_detach_stdio_in_child)


@contextlib.contextmanager
def _children_detached() -> Iterator[None]:
    global _submitting
    with _lock:
        _submitting += 1
    try:
        yield
    finally:
        with _lock:
            _submitting -= 1


def submit(spec: specmod.JobSpec, executor: launch.Executor) -> launch.Submission:
    with _children_detached():
        return launch.submit(spec, executor)


def resume(
    run: runfolder.RunFolder, step: int | None, overrides: list[str], executor: launch.Executor
) -> tuple[launch.Submission, int | None]:
    """A new attempt of `run` from the checkpoint at `step` (newest if None), as `clusterfsdp
    resume` does: newer checkpoints are set aside, the overrides go into the run's job.toml.
    Returns the submission and the step it resumes from (None: from scratch)."""
    spec = specmod.load(run.job_toml, overrides)
    root = run.checkpoints_dir(spec)
    target = ckptfolder.find(root, step)
    if step is not None and target is None:
        have = ", ".join(str(c.step) for c in ckptfolder.list_checkpoints(root)) or "none"
        raise launch.SubmitError(f"run {run.id}: no complete checkpoint at step {step} (have: {have})")
    if target is not None and step is not None:
        ckptfolder.keep_only_up_to(root, target.step)
    previous = run.job_toml.read_text()
    run.job_toml.write_text(specmod.dumps(spec, redact=True))  # the new attempt runs with the overrides
    reason = f"resume from step {target.step if target else 0}"
    try:
        with _children_detached():
            sub = launch.submit(spec, executor, run=run, reason=reason, resume_step=target.step if target else None)
    except BaseException:
        run.job_toml.write_text(previous)  # nothing was queued: the run keeps its spec
        raise
    return sub, target.step if target else None


def cancel(row: QueueRow, slurm: Slurm) -> str:
    """Cancel a run's live attempt (workers save first), or a Slurm job that has no run folder."""
    if row.run is not None:
        return launch.cancel(row.run)
    slurm.cancel(row.job_id)
    return f"scancel {row.job_id}: sent"
