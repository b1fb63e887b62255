"""The compose screen's live summary and sbatch preview for a valid spec.

The summary is `clusterfsdp validate`'s (control.summary) plus the memory estimate; the preview is
the exact script `launch.render_sbatch` would write for this spec, with a placeholder run id.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clusterfsdp.control import launch, runfolder
from clusterfsdp.control import spec as specmod
from clusterfsdp.control.summary import summary

from .estimate import estimate


@dataclass(frozen=True)
class Summary:
    spec: specmod.JobSpec  # with paths made absolute against the job file's folder: what is submitted
    text: str
    sbatch: str


def where(executor: str, nodes: int, slurm_available: bool | None) -> str:
    if executor == "auto":
        executor = {True: "slurm", False: "local", None: "auto"}[slurm_available]
    if executor == "auto":
        return "Slurm if a controller answers, else this machine (checking…)"
    if executor == "local":
        text = "this machine (local executor)"
        return text + (f" -- but slurm.nodes = {nodes} needs Slurm" if nodes > 1 else "")
    return "Slurm" + (" -- but no controller answers `scontrol ping` now" if slurm_available is False else "")


def summarize(spec: specmod.JobSpec, base: Path, executor: str, slurm_available: bool | None) -> Summary:
    absolute = specmod.with_absolute_paths(spec, base)
    text = summary(spec, where(executor, spec.slurm.nodes, slurm_available))
    memory = estimate(absolute)
    per = "GPU" if spec.slurm.gpus_per_node else "rank"
    text += "\nmemory     " + (memory.describe(per) if memory else "unknown (the model's config.json is not local)")
    placeholder = runfolder.RunFolder(Path(absolute.job.run_root) / spec.job.name / "<run id>")
    try:
        sbatch = launch.render_sbatch(absolute, placeholder)
    except launch.SubmitError as e:
        sbatch = f"# cannot render: {e}"
    return Summary(absolute, text, sbatch)
