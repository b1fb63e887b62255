"""What the Sweeps screen shows, read in a worker thread: every sweep under the run root with
its points' statuses (the same control-plane reads as `runs` and `status SWEEP`), and the loss
curves of the selected sweep's points (their metrics.jsonl, read whole on each refresh).

The sweep modules are imported here, and this module only when the screen first refreshes, so
the TUI's start-up imports none of them (tests/test_cli.py counts the modules)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from clusterfsdp.control.sweepfolder import PointStatus, SweepFolder, SweepSummary, all_sweeps
from clusterfsdp.core.errors import describe
from clusterfsdp.core.records import SweepRecord

from .metrics_tail import MetricsTail


@dataclass(frozen=True)
class Curve:
    """One point's loss and eval loss, by step."""

    loss: tuple[list[int], list[float]]
    eval_loss: tuple[list[int], list[float]]


@dataclass(frozen=True)
class SweepRow:
    folder: SweepFolder
    record: SweepRecord | None  # None: sweep.json unreadable (error says why)
    points: list[PointStatus] = field(default_factory=list)
    summary: SweepSummary | None = None
    error: str = ""

    @property
    def key(self) -> str:
        return str(self.folder.path)


@dataclass(frozen=True)
class SweepsRefresh:
    sweeps: list[SweepRow]
    curves: dict[int, Curve]  # the selected sweep's points, by point index
    error: str  # Slurm's, if squeue or sacct did not answer


def _row(folder: SweepFolder) -> tuple[SweepRow, str]:
    try:
        rows, error = folder.statuses()
        return SweepRow(folder, folder.record(), rows, SweepSummary.of(rows)), error
    except Exception as e:  # one unreadable sweep must not hide the others
        return SweepRow(folder, None, error=describe(e)), ""


def _curve(row: PointStatus, folder: SweepFolder) -> Curve:
    tail = MetricsTail(folder.run_folder(row.point).metrics_file)
    tail.read_new()
    metrics = tail.snapshot()
    return Curve(metrics.series("loss"), metrics.series("eval_loss"))


def collect(run_root: Path, selected: str | None) -> SweepsRefresh:
    """Every sweep (newest first), and the curves of `selected` (a sweep folder; the first sweep
    when None or gone)."""
    sweeps, errors = [], []
    for folder in all_sweeps(run_root):
        row, error = _row(folder)
        sweeps.append(row)
        errors.append(error)
    chosen = next((s for s in sweeps if s.key == selected), sweeps[0] if sweeps else None)
    curves = {p.point.index: _curve(p, chosen.folder) for p in chosen.points} if chosen else {}
    return SweepsRefresh(sweeps, curves, next((e for e in errors if e), ""))
