"""What the TUI changes in the world: submit, sweep, resume, cancel, remove. Blocking calls, run in workers.

Each is one call into the run service (`clusterfsdp.control.run.Run`) or the sweep service
(`clusterfsdp.control.sweep.Sweep`), exactly what the CLI calls, so the TUI cannot drift from
`clusterfsdp submit/sweep/resume/cancel/rm`. The local executor's
controller is started with its stdio on a log file by the service, so nothing it prints can
scribble over the screen or hold a web session's pipe open.
"""

from __future__ import annotations

from clusterfsdp.control import launch
from clusterfsdp.control.run import Run, Submission
from clusterfsdp.control.sweep import Sweep
from clusterfsdp.core import spec as specmod

from .queue_rows import QueueRow, SlurmCommands


def requested(value: object) -> launch.Requested:
    """A Select's value as the executor the service takes ("auto" unless slurm or local)."""
    return "slurm" if value == "slurm" else "local" if value == "local" else "auto"


def submit(spec: specmod.JobSpec, executor: launch.Requested) -> Submission:
    return Run.submit(spec, executor)


def sweep(job: specmod.JobText, executor: launch.Requested) -> tuple[Sweep, str]:
    """A sweep of the compose form's job (its [sweep] table from the fields that are lists), as
    `clusterfsdp sweep` makes one: every point checked as a run, then queued; and the executor's
    notice."""
    planned = Sweep.plan(job, executor=executor)
    return Sweep.submit(planned), planned.notice


def resume(run: Run, step: int | None, overrides: list[str], executor: launch.Requested) -> Submission:
    """A new attempt of `run` from the checkpoint at `step` (newest if None), as `clusterfsdp
    resume` does: newer checkpoints are set aside, the overrides go into the run's job.toml."""
    return run.resume(step=step, overrides=overrides, executor=executor)


def cancel(row: QueueRow, slurm: SlurmCommands) -> str:
    """Cancel a run's live attempt (workers save first), or a Slurm job that has no run folder."""
    if row.run is not None:
        return Run(row.run).cancel()
    slurm.cancel(row.job_id)
    return f"scancel {row.job_id}: sent"


def remove(row: QueueRow) -> str:
    """Delete a run's folder and checkpoints, as `clusterfsdp rm` does (refused while live)."""
    assert row.run is not None, "only rows with a run folder can be removed"
    return Run(row.run).remove()
