"""The notebook's way out of its allocation: `clusterfsdp.submit` and `clusterfsdp.sweep` (the
package exports them, importing this module when one is first used)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from .control.run import Run, Submission
from .control.sweep import Sweep
from .core.spec import JobSpec
from .core.spec.schema import SweepSection
from .notebook import load_job
from .sweephandle import SweepHandle


def submit(
    job: str | os.PathLike[str] | JobSpec,
    *,
    executor: str = "auto",
    overrides: Mapping[str, Any] | Iterable[str] | str | None = None,
) -> Submission:
    """Queue `job` like `clusterfsdp submit` (the notebook's way out when the kernel is not in an
    allocation): a job.toml path, TOML text or a JobSpec, with 'section.key=value' overrides (a
    list, or a dict {'section.key': value}); executor 'auto' (Slurm when a controller answers, else
    submitit's local executor), 'slurm' or 'local'. Returns the run service's Submission (run,
    executor, job id). Raises a `clusterfsdp.UserError` (spec.SpecError for a bad spec,
    launch.SubmitError when the job cannot be queued, ...), shown without a traceback in IPython."""
    if executor not in ("auto", "slurm", "local"):
        raise ValueError(f"executor must be 'auto', 'slurm' or 'local', not {executor!r}")
    return Run.submit(load_job(job, overrides), executor)  # type: ignore[arg-type]


def sweep(
    job: str | os.PathLike[str],
    grid: Mapping[str, Iterable[Any]] | None = None,
    *,
    zip: Mapping[str, Iterable[Any]] | None = None,  # (the CLI's --zip)
    max_parallel: int | None = None,
    overrides: Iterable[str] = (),
    executor: str = "auto",
) -> SweepHandle:
    """Queue a sweep of the job file `job` like `clusterfsdp sweep` (docs/sweeps.md): `grid`
    {'train.lr': [1e-4, 3e-4], ...} (the cross product), `zip` (keys varied together), over the
    file's [sweep] table; values typed by the schema. Every point is checked first: one bad
    point raises a `clusterfsdp.UserError` naming it, and nothing is queued. The handle's
    `.frame()` is a DataFrame of the points' final and best metrics."""
    if executor not in ("auto", "slurm", "local"):
        raise ValueError(f"executor must be 'auto', 'slurm' or 'local', not {executor!r}")
    values = SweepSection(
        grid={k: list(v) for k, v in (grid or {}).items()}, zip={k: list(v) for k, v in (zip or {}).items()}
    )
    planned = Sweep.plan(os.fspath(job), values=values, max_parallel=max_parallel, overrides=list(overrides),
                         executor=executor)  # type: ignore[arg-type]  # fmt: skip
    return SweepHandle(Sweep.submit(planned))
