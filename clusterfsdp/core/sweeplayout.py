"""The sweep folder's layout and records: what a rank needs of its sweep (its id, the folder its
trackers group in) without the status machinery that `status SWEEP` reads it with
(control/sweepfolder.py).

    <run_root>/<job.name>-<sweep id>/      every point's job.name, so `runs` finds the points
        sweep.json                         SweepRecord (records.py)
        driver.json, driver.log            local sweeps: the driver's identity and output
        submitit/                          the job array's batch script (Slurm)
        <sweep id without 'sw'>-p<i>/      point i's run folder

Sweep ids start with 'sw' and run ids with a digit, so one reference never means both.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import fileio, runfolder
from .procs import ProcessId
from .records import SweepPoint, SweepRecord
from .value import value

SWEEP_FILE = "sweep.json"
DRIVER_FILE = "driver.json"
ID_PREFIX = "sw"


@value(frozen=True)
class SweepLayout:
    """A sweep folder's paths and records (the layout above); control/sweepfolder.py adds what
    needs the run service's status."""

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
        fileio.atomic_write(self.record_file, json.dumps(record.to_dict(), indent=2, sort_keys=True) + "\n")

    def run_folder(self, point: SweepPoint) -> runfolder.RunFolder:
        return runfolder.RunFolder(self.path / point.run_id)

    def driver(self) -> ProcessId | None:
        """The local driver's identity, if one was started."""
        try:
            return ProcessId.from_record(fileio.load_json(self.driver_file))
        except (OSError, ValueError, AttributeError):
            return None

    def write_driver(self, me: ProcessId) -> None:
        fileio.atomic_write(self.driver_file, json.dumps(me.record(), sort_keys=True) + "\n")


def sweep_of(run: runfolder.RunFolder) -> SweepLayout | None:
    """The sweep a run is a point of, if any."""
    return SweepLayout(run.path.parent) if (run.path.parent / SWEEP_FILE).is_file() else None
