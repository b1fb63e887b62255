"""Run a job.toml from a Jupyter notebook: `srun` into the allocation the kernel sits in, or
local processes on a machine without Slurm, with live output, a progress display, a working
stop button and the result back as Python data.

    from clusterfsdp.notebook import srun
    result = srun("jobs/tiny-cpu.toml", nodes=2)       # inside `salloc -N2 ...`
    result.final_metrics, result.checkpoint, result.exit_codes

Where it runs (`launcher="auto"`):

* `SLURM_JOB_ID` is set and `srun` is on PATH: one job step in that allocation, one task per
  GPU (or `slurm.tasks_per_node`), every resource restated on the srun line and the inherited
  `SLURM_*` variables that would conflict with them scrubbed.
* no allocation, but a Slurm controller answers: an error saying to `salloc` first or to use
  `clusterfsdp.submit(...)` (a batch job).
* no allocation and no reachable Slurm: local processes on this machine (torchrun-style env),
  with the same streaming and interrupt behaviour.

The launcher (srun, or the local supervisor below) runs in its own session, so the SIGINT that
Jupyter's stop button sends to the kernel's process group never reaches it uncontrolled; on
KeyboardInterrupt the step is cancelled explicitly (SIGTERM: the ranks save a checkpoint at the
next step boundary; SIGKILL after `grace_s`), and this waits until every rank is gone.

The run goes through the run service like `clusterfsdp submit` (`Run.srun`: the same checks, hub
resolution and data check, then the run folder and the attempt record; the backend
`control.backends.SrunStep` or `LocalRanks` starts the launcher), and the stop button is
`Run.cancel`: `clusterfsdp status/logs/cancel` and the TUI see the run like any other.
Each rank runs `python -m clusterfsdp.notebook.tasks _task RUN_DIR`, a thin wrapper over
`clusterfsdp.worker.main.run` that reports its host and exit status on stdout.

Modules: `job` (what a cell runs), `placement` (where: srun or local, and the exact srun line),
`step` (one launch as the cell shows it: output by rank, progress, the stop button, the result),
`stepdisplay` (the cell's display), `result` (what comes back), `tasks` (the rank and
local-supervisor processes), `launcherrors`, `magics`.
Importing this package is cheap: no torch, no IPython (both are imported where needed).
"""

from __future__ import annotations

from ..core.slurmcli import allocation_nodes
from ..worker.main import ENV_LOG_ALL_RANKS
from .job import load_job, with_layout
from .launcherrors import NotebookError, NotInAllocation, SrunError, StepFailed, StepInterrupted
from .placement import choose_launcher, in_allocation, launcher_env, srun_command
from .result import SrunResult, last_result
from .step import srun

__all__ = [
    "ENV_LOG_ALL_RANKS",
    "NotInAllocation",
    "NotebookError",
    "SrunError",
    "SrunResult",
    "StepFailed",
    "StepInterrupted",
    "allocation_nodes",
    "choose_launcher",
    "in_allocation",
    "last_result",
    "launcher_env",
    "load_job",
    "srun",
    "srun_command",
    "with_layout",
]
