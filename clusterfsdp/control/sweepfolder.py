"""The sweep folder: paths and typed reads of one sweep (control.sweep makes and changes it), and
finding sweeps by id or prefix, for the read-only commands (`status SWEEP`, `runs`, the notebook
frame) that must not import the run service.

    <run_root>/<job.name>-<sweep id>/      every point's job.name, so `runs` finds the points
        sweep.json                         SweepRecord (records.py)
        driver.json, driver.log            local sweeps: the driver's identity and output
        submitit/                          the job array's batch script (Slurm)
        <sweep id without 'sw'>-p<i>/      point i's run folder

Sweep ids start with 'sw' and run ids with a digit, so one reference never means both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from . import runfolder, status
from .errors import UserError
from .procs import ProcessId
from .records import SweepPoint, SweepRecord
from .runroot import ENV_RUN_ROOT, default_run_root

SWEEP_FILE = "sweep.json"
DRIVER_FILE = "driver.json"
ID_PREFIX = "sw"


class SweepNotFound(UserError, LookupError):
    pass


@dataclass(frozen=True)
class PointStatus:
    """One row of `status SWEEP`: the point, its varied values and its run's status."""

    point: SweepPoint
    status: status.RunStatus


@dataclass(frozen=True)
class SweepFolder:
    path: Path

    @property
    def id(self) -> str:
        """The id in the folder's name (<job.name>-<sweep id>), read without opening sweep.json."""
        name = self.path.name
        at = name.rfind(f"-{ID_PREFIX}")
        return name[at + 1 :] if at >= 0 else name

    record_file = property(lambda self: self.path / SWEEP_FILE)
    driver_file = property(lambda self: self.path / DRIVER_FILE)
    driver_log = property(lambda self: self.path / "driver.log")
    submitit_dir = property(lambda self: self.path / "submitit")

    def record(self) -> SweepRecord:
        """sweep.json (RecordError naming the file if it cannot be read)."""
        return SweepRecord.read(self.record_file)

    def write_record(self, record: SweepRecord) -> None:
        runfolder.atomic_write(self.record_file, json.dumps(record.to_dict(), indent=2, sort_keys=True) + "\n")

    def run_folder(self, point: SweepPoint) -> runfolder.RunFolder:
        return runfolder.RunFolder(self.path / point.run_id)

    def driver(self) -> ProcessId | None:
        """The local driver's identity, if one was started."""
        try:
            return ProcessId.from_record(json.loads(self.driver_file.read_text()))
        except (OSError, ValueError, AttributeError):
            return None

    def write_driver(self, me: ProcessId) -> None:
        runfolder.atomic_write(self.driver_file, json.dumps(me.record(), sort_keys=True) + "\n")

    def statuses(self) -> tuple[list[PointStatus], str]:
        """Every point's run status (one squeue + sacct for all) and Slurm's error, if any."""
        record = self.record()
        rows, error = status.statuses([self.run_folder(p) for p in record.points])
        return [PointStatus(p, st) for p, st in zip(record.points, rows, strict=True)], error


def is_sweep_ref(ref: str) -> bool:
    """`ref` names a sweep (its id or a prefix of one, or its folder), not a run."""
    return ref.startswith(ID_PREFIX) or (Path(ref).expanduser() / SWEEP_FILE).is_file()


def all_sweeps(run_root: str | Path | None = None) -> list[SweepFolder]:
    """Sweeps under the run root, newest first."""
    root = Path(run_root).expanduser() if run_root is not None else default_run_root()
    found = [SweepFolder(p.parent.resolve()) for p in root.glob(f"*/{SWEEP_FILE}")] if root.is_dir() else []
    return sorted(found, key=lambda s: s.id, reverse=True)


def find_sweep(ref: str, run_root: str | Path | None = None) -> SweepFolder:
    """A sweep from its folder, its id or a unique prefix of its id."""
    if (Path(ref).expanduser() / SWEEP_FILE).is_file():
        return SweepFolder(Path(ref).expanduser().resolve())
    every = all_sweeps(run_root)
    found = [s for s in every if s.id == ref] or [s for s in every if s.id.startswith(ref)]
    if len(found) == 1:
        return found[0]
    root = Path(run_root).expanduser() if run_root is not None else default_run_root()
    if not found:
        hint = f"give the sweep folder, --run-root, or set ${ENV_RUN_ROOT}"
        raise SweepNotFound(f"no sweep {ref!r} under {root} ({hint})")
    raise SweepNotFound(f"{ref!r} matches {len(found)} sweeps: {', '.join(s.id for s in found[:5])}")


def sweep_of(run: runfolder.RunFolder) -> SweepFolder | None:
    """The sweep a run is a point of, if any."""
    return SweepFolder(run.path.parent) if (run.path.parent / SWEEP_FILE).is_file() else None
