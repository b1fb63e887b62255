"""The job a notebook cell runs: a job.toml path, TOML text or a JobSpec, with overrides and a layout."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..core import spec as specmod


def _override_list(overrides: Mapping[str, Any] | Iterable[str] | str | None) -> list[str]:
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [overrides]
    if isinstance(overrides, Mapping):
        return [f"{key}={specmod.render_value(value)}" for key, value in overrides.items()]
    return [str(o) for o in overrides]


def load_job(
    job: str | os.PathLike[str] | specmod.JobSpec, overrides: Mapping[str, Any] | Iterable[str] | str | None = None
) -> specmod.JobSpec:
    """A JobSpec from a job.toml path, TOML text or a JobSpec, with `--set`-style overrides
    (a list of 'section.key=value' or a dict {'section.key': value}). Relative paths in TOML text
    or a JobSpec are taken relative to the current directory (the notebook's folder)."""
    ovr = _override_list(overrides)
    if isinstance(job, specmod.JobSpec):
        data = specmod.to_dict(job)
        specmod.apply_overrides(data, ovr)
        return specmod.with_absolute_paths(specmod.from_dict(data), Path.cwd())
    if isinstance(job, os.PathLike):
        return specmod.load(Path(job).expanduser(), ovr)
    if isinstance(job, str):
        is_path = "\n" not in job and ("=" not in job or Path(job).expanduser().is_file())
        if is_path:
            return specmod.load(Path(job).expanduser(), ovr)
        return specmod.with_absolute_paths(specmod.loads(job, ovr), Path.cwd())
    raise TypeError(f"job: expected a path, TOML text or a JobSpec, found {type(job).__name__}")


def with_layout(
    spec: specmod.JobSpec, nodes: int | None = None, gpus_per_node: int | None = None, tasks_per_node: int | None = None
) -> specmod.JobSpec:
    """The spec with the step's layout written into it (the workers build their mesh from it)."""
    s = spec.slurm
    changes: dict[str, int] = {}
    if nodes is not None:
        changes["nodes"] = int(nodes)
    if gpus_per_node is not None:
        changes["gpus_per_node"] = int(gpus_per_node)
        if tasks_per_node is None and gpus_per_node and s.tasks_per_node not in (0, gpus_per_node):
            changes["tasks_per_node"] = 0  # one task per GPU
    if tasks_per_node is not None:
        changes["tasks_per_node"] = int(tasks_per_node)
    if not changes:
        return spec
    out = dataclasses.replace(spec, slurm=dataclasses.replace(s, **changes))
    specmod.check(out)
    return out
