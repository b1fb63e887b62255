"""A run's checkpoints as the run screen lists them: complete ones (resumable), partial ones
(a save that never finished: a crash, kill -9, a full disk) and ones set aside by a resume
from an older step. Sizes and times come from the folders, read in a worker."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from clusterfsdp.core import ckptfolder
from clusterfsdp.core.records import MAX_SECONDS

State = Literal["complete", "partial", "set aside"]


@dataclass(frozen=True)
class CheckpointRow:
    step: int
    path: Path
    state: State
    saved: float  # when it was completed (or last written to, for the others)
    size: int

    @property
    def resumable(self) -> bool:
        return self.state == "complete"


def folder_size(path: Path) -> int:
    total = 0
    for parent, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(parent, name)).st_size
            except OSError:
                pass  # deleted by keep_last while we looked
    return total


def _saved(c: ckptfolder.CheckpointInfo) -> float:
    """When a checkpoint was completed: its record's `saved`, or its folder's mtime when that is no
    time a clock could show (a damaged or foreign clusterfsdp.json: 1e300 overflowed the header)."""
    saved = c.meta.get("saved")
    if isinstance(saved, (int, float)) and not isinstance(saved, bool) and 0 < saved <= MAX_SECONDS:
        return float(saved)
    return c.path.stat().st_mtime


def scan(root: Path) -> list[CheckpointRow]:
    """Every checkpoint folder under `root`, newest step first."""
    rows = [CheckpointRow(c.step, c.path, "complete", _saved(c), folder_size(c.path))
            for c in ckptfolder.list_checkpoints(root)]  # fmt: skip
    others: list[tuple[int, Path, State]] = [(step, p, "partial") for step, p in ckptfolder.partial_steps(root)]
    others.extend((step, p, "set aside") for step, p in ckptfolder.set_aside_steps(root))
    for step, p, state in others:
        try:
            rows.append(CheckpointRow(step, p, state, p.stat().st_mtime, folder_size(p)))
        except FileNotFoundError:
            pass  # renamed into place while we looked
    return sorted(rows, key=lambda r: (r.step, r.state == "complete"), reverse=True)
