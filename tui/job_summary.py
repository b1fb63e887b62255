"""The compose screen's live summary and sbatch preview for a valid spec.

The summary is `clusterfsdp validate`'s (control.summary) plus the memory estimate, and for a
sweep its points and what they vary; the preview is the exact script `launch.render_sbatch` would
write for this spec, with a placeholder run id.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clusterfsdp.control import launch
from clusterfsdp.control.partitions import Partition
from clusterfsdp.control.summary import summary
from clusterfsdp.control.sweepplan import Varied, render_values
from clusterfsdp.core import runfolder
from clusterfsdp.core import spec as specmod

from .estimate import estimate


@dataclass(frozen=True)
class Summary:
    spec: specmod.JobSpec  # with paths made absolute against the job file's folder: what is submitted
    text: str
    sbatch: str
    sweep: Varied | None = None  # a sweep's points: submitted as a sweep of `spec`'s job


def where(executor: str, spec: specmod.JobSpec, slurm_available: bool | None) -> str:
    if executor == "auto":
        executor = {True: "slurm", False: "local", None: "auto"}[slurm_available]
    if executor == "auto":
        return "Slurm if a controller answers, else this machine (checking…)"
    if executor == "local":
        needs = spec.needs_slurm()
        return "this machine (local executor)" + (f" -- but {needs}" if needs else "")
    return "Slurm" + (" -- but no controller answers `scontrol ping` now" if slurm_available is False else "")


def partition_text(spec: specmod.JobSpec, partitions: list[Partition]) -> str:
    """What the job's partition has free now (from the last sinfo), and whether the job can fit
    there at all: a request no node or partition can meet would pend forever."""
    name = spec.slurm.partition
    p = next((p for p in partitions if (p.name == name if name else p.default)), None)
    if p is None:
        known = ", ".join(p.name for p in partitions) or "none"
        return f"{name or 'no default partition'}: not in sinfo's list ({known})"
    text = f"{p.name}: {p.nodes_idle} of {p.nodes_total} nodes idle"
    if p.gpus_total:
        text += f", {p.gpus_free} of {p.gpus_total} GPUs free"
    if not p.up:
        text += f" -- but the partition is {p.available}"
    elif spec.node_range.low > p.nodes_total:
        text += f" -- but the job asks for {spec.node_range.low} nodes"
    elif spec.slurm.gpus_per_node > p.gpus_max_per_node:
        text += f" -- but no node has {spec.slurm.gpus_per_node} GPUs (at most {p.gpus_max_per_node})"
    return text


def summarize(
    spec: specmod.JobSpec,
    base: Path,
    executor: str,
    slurm_available: bool | None,
    partitions: list[Partition] | None = None,
    sweep: Varied | None = None,
) -> Summary:
    absolute = specmod.with_absolute_paths(spec, base)
    text = sweep_text(sweep) if sweep else ""
    text += summary(absolute, where(executor, spec, slurm_available))
    if partitions is not None and (executor == "slurm" or (executor == "auto" and slurm_available)):
        text += "\npartition  " + partition_text(spec, partitions)
    memory = estimate(absolute)
    per = "GPU" if spec.slurm.gpus_per_node else "rank"
    text += "\nmemory     " + (memory.describe(per) if memory else "unknown (the model's config.json is not local)")
    placeholder = runfolder.RunFolder(Path(absolute.job.run_root) / spec.job.name / "<run id>")
    try:
        sbatch = launch.render_sbatch(absolute, placeholder)
    except launch.SubmitError as e:
        sbatch = f"# cannot render: {e}"
    if sweep:
        n = len(sweep.points)
        sbatch = f"# on Slurm the sweep's {n} points are ONE job array (--array=0-{n - 1}); one run alone:\n{sbatch}"
    return Summary(absolute, text, sbatch, sweep)


def sweep_text(sweep: Varied) -> str:
    """The points and what they vary, above the summary of the job they vary."""
    lines = [f"sweep      {len(sweep.points)} points, one run each, varying"]
    for axis in sweep.axes:
        lines.append(f"           {axis.key} = {render_values(axis.values)}" + (" (zipped)" if axis.zipped else ""))
    return "\n".join(lines) + "\n\n"
