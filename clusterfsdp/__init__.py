"""clusterfsdp: from a job.toml to a multi-node FSDP2/HSDP training run on Slurm (or this machine).

Importing the package is cheap (no torch); the worker imports torch lazily.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .control.launch import Submission
    from .control.spec import JobSpec

__version__ = "0.1.0"


def submit(
    job: str | os.PathLike[str] | JobSpec,
    *,
    executor: str = "auto",
    overrides: Mapping[str, Any] | Iterable[str] | str | None = None,
) -> Submission:
    """Queue `job` like `clusterfsdp submit` (the notebook's way out when the kernel is not in an
    allocation): a job.toml path, TOML text or a JobSpec, with 'section.key=value' overrides (a
    list, or a dict {'section.key': value}); executor 'auto' (Slurm when a controller answers, else
    submitit's local executor), 'slurm' or 'local'. Returns the launch.Submission (run folder,
    executor, job id). Raises spec.SpecError for a bad spec and launch.SubmitError when the job
    cannot be queued."""
    from .control import launch
    from .notebook import load_job

    return launch.submit(load_job(job, overrides), executor)


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext clusterfsdp`: registers the `%clusterfsdp srun|submit` line magic."""
    from .notebook.magics import load_ipython_extension as load

    load(ipython)
