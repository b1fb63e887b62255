"""What a notebook launch returns: the run, each rank's exit status, hosts, metrics and checkpoint."""

from __future__ import annotations

import dataclasses
import html
from pathlib import Path
from typing import Any

from ..core import runfolder

_last_result: SrunResult | None = None


@dataclasses.dataclass
class SrunResult:
    """What a notebook launch did. `metrics` are the metrics.jsonl rows (list of dicts);
    `final_metrics` the last one; `exit_codes` {rank: code} (negative: killed by that signal,
    None: unknown)."""

    run: runfolder.RunFolder
    launcher: str  # srun | local
    job_id: str  # the attempt's job id in the run folder: SLURM_JOB_ID of the allocation, or 'nb<pid>'
    step: str  # srun: the job step '<SLURM_JOB_ID>.<step>' (what scancel and `squeue --steps` name); local: ''
    status: str  # completed | stopped | interrupted | failed
    returncode: int | None
    exit_codes: dict[int, int | None]
    hosts: dict[int, str]
    metrics: list[dict[str, Any]]
    checkpoint: Path | None
    elapsed_s: float
    message: str = ""

    @property
    def run_dir(self) -> Path:
        return self.run.path

    @property
    def where(self) -> str:
        return f"srun step {self.step}" if self.step else f"{self.launcher} job {self.job_id}"

    @property
    def final_metrics(self) -> dict[str, Any]:
        return dict(self.metrics[-1]) if self.metrics else {}

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    def metrics_frame(self):
        """The metrics as a pandas DataFrame when pandas is installed, else the list of rows."""
        try:
            import pandas as pd  # pyright: ignore[reportMissingImports]  (optional)
        except ImportError:
            return list(self.metrics)
        return pd.DataFrame(self.metrics)

    def log(self, rank: int = 0) -> str:
        """This rank's log of this launch."""
        p = self.run.log_path(self.job_id, 0, rank)
        return p.read_text() if p.is_file() else ""

    def summary(self) -> str:
        m = self.final_metrics
        parts = [
            f"run {self.run.id}: {self.status}",
            self.where,
            f"{len(self.exit_codes)} ranks",
            f"{self.elapsed_s:.1f} s",
        ]
        if m:
            parts.append(f"step {m.get('step')} loss {m.get('loss', float('nan')):.4f}")
        lines = [", ".join(parts), f"folder      {self.run.path}"]
        if self.checkpoint:
            lines.append(f"checkpoint  {self.checkpoint}")
        codes = " ".join(f"{r}:{'?' if c is None else c}" for r, c in sorted(self.exit_codes.items()))
        lines.append(f"exit codes  {codes or '-'}" + (f"  (srun {self.returncode})" if self.launcher == "srun" else ""))
        if self.message:
            lines.append(self.message)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<SrunResult {self.summary()}>"

    def _repr_html_(self) -> str:
        m = self.final_metrics
        rows = [
            ("run", self.run.id),
            ("status", self.status),
            ("launcher", self.where),
            ("folder", str(self.run.path)),
            ("checkpoint", str(self.checkpoint or "-")),
            (
                "exit codes",
                ", ".join(
                    f"rank {r} on {self.hosts.get(r, '?')}: {'?' if c is None else c}"
                    for r, c in sorted(self.exit_codes.items())
                ),
            ),
            ("elapsed", f"{self.elapsed_s:.1f} s"),
        ]
        for key in ("step", "loss", "tokens_per_s", "mem_peak_gb"):
            if key in m:
                rows.append((key, f"{m[key]:,.4g}" if isinstance(m[key], float) else str(m[key])))
        body = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th><td style='text-align:left'>"
            f"{html.escape(v)}</td></tr>"
            for k, v in rows
        )
        return f"<table>{body}</table>"


def last_result() -> SrunResult | None:
    """The result of the latest `srun(...)` in this process (also after an interrupt)."""
    return _last_result


def remember(result: SrunResult) -> None:
    global _last_result
    _last_result = result
