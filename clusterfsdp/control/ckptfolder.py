"""The checkpoint folder layout, shared by the worker (which writes it) and the control plane
(status, resume, export, the TUI, which read it). Pure Python: no torch.

    checkpoints/step-00000100/
        .metadata  __0_0.distcp ...   DCP: model + optimizer, resharded on load
        rng/rank<R>.pt                 CPU (and CUDA) RNG state of each rank
        clusterfsdp.json               step, tokens seen, data position, world size
        job.toml                       the spec it was made with

A checkpoint is written under `.step-<N>.partial/` and renamed to `step-<N>` only after
every rank's shards and DCP's `.metadata` are on disk, so a crash, a kill -9 or a full
disk mid-save leaves a partial folder that resume never picks. `keep_last` deletes old
ones only after a newer one is complete.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COMPLETE = "clusterfsdp.json"
_STEP = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int
    meta: dict[str, Any]


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def is_complete(path: Path) -> bool:
    return (path / ".metadata").is_file() and (path / COMPLETE).is_file()


def list_checkpoints(root: Path) -> list[CheckpointInfo]:
    """Complete checkpoints, oldest first (pure Python: used by status, the TUI and export)."""
    out = []
    if root.is_dir():
        for p in root.iterdir():
            m = _STEP.match(p.name)
            if m and is_complete(p):
                try:
                    meta = json.loads((p / COMPLETE).read_text())
                except (OSError, json.JSONDecodeError):
                    continue
                out.append(CheckpointInfo(p, int(m.group(1)), meta))
    return sorted(out, key=lambda c: c.step)


def find(root: Path, step: int | None = None) -> CheckpointInfo | None:
    """The newest complete checkpoint, or the one at `step`."""
    found = list_checkpoints(root)
    if step is not None:
        found = [c for c in found if c.step == step]
    return found[-1] if found else None


def keep_only_up_to(root: Path, step: int) -> list[tuple[Path, Path]]:
    """Move complete checkpoints newer than `step` into `set-aside/` (never deleted), so a
    resume picks `step`. Returns (original, new) paths, so that the move can be undone."""
    moved: list[tuple[Path, Path]] = []
    for info in list_checkpoints(root):
        if info.step > step:
            dest = root / "set-aside" / f"{info.path.name}-{int(time.time())}"
            dest.parent.mkdir(exist_ok=True)
            os.replace(info.path, dest)
            moved.append((info.path, dest))
    return moved
