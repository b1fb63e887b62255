"""The checkpoint folder layout, shared by the worker (which writes it) and the control plane
(status, resume, export, the TUI, which read it). Every name in it is spelled here once. Pure
Python: no torch.

    checkpoints/step-00000100/
        .metadata  __0_0.distcp ...   DCP: model + optimizer, resharded on load
        rng/rank<R>.pt                 CPU (and CUDA) RNG state of each rank
        clusterfsdp.json               the train state (step, data position, lr curve, ...), world size,
                                       SHA-256 of the small files and the size of every shard
        job.toml                       the spec it was made with
    checkpoints/.step-00000200.partial/   a save in progress (or one a crash cut off)
    checkpoints/.pruning/                 old checkpoints being deleted in the background
    checkpoints/set-aside/step-N-T        newer ones a `resume --step` moved away (never deleted)
    checkpoints/set-aside/step-N-unreadable-T   ones that did not load on some rank
    checkpoints/.bench-hold-N             step N waits for its benchmark evaluation to export it
                                          (keep_last lets it go only after: control/benchrun.py), with
                                          keep_best on a benchmark score until its result landed
    checkpoints/.bench-best.json          keep_best on a benchmark score: the best step so far
                                          (core/benchbest.py writes it as each result lands)

A checkpoint is written under `.step-<N>.partial/` and renamed to `step-<N>` only after
every rank's shards and DCP's `.metadata` are on disk, so a crash, a kill -9 or a full
disk mid-save leaves a partial folder that resume never picks. `keep_last` deletes old
ones only after a newer one is complete, never the best one (checkpoint.keep_best: the
`best_step` every checkpoint's clusterfsdp.json records, or for a benchmark score the step
`.bench-best.json` records).
"""

from __future__ import annotations

import errno
import os
import re
import time
from pathlib import Path
from typing import Any

from . import fileio, ownership
from .value import value

COMPLETE = "clusterfsdp.json"
DCP_METADATA = ".metadata"
JOB_TOML = "job.toml"
RNG_DIR = "rng"
PRUNING = ".pruning"
SET_ASIDE = "set-aside"
UNREADABLE = "unreadable"
_STEP = r"^step-(\d+)$"
_PARTIAL_GLOB = ".step-*.partial"
_PARTIAL_NAME = r"^\.step-(\d+)\.partial$"
_SET_ASIDE_NAME = r"^step-(\d+)(?:-.+)?-\d+$"
_HOLD = ".bench-hold-"


@value(frozen=True)
class CheckpointInfo:
    path: Path
    step: int
    meta: dict[str, Any]


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def partial_dir(root: Path, step: int) -> Path:
    """Where the save of `step` is written until it is complete."""
    return root / f".step-{step:08d}.partial"


def partial_dirs(root: Path) -> list[Path]:
    """Saves in progress, or cut off by a crash."""
    return sorted(root.glob(_PARTIAL_GLOB))


def partial_steps(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every save in progress or cut off by a crash."""
    return [(int(m.group(1)), p) for p in partial_dirs(root) if (m := re.match(_PARTIAL_NAME, p.name))]


def set_aside_steps(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint `set_aside` moved away (`step-N[-why]-T`)."""
    folder = set_aside_dir(root)
    if not folder.is_dir():
        return []
    return [(int(m.group(1)), p) for p in folder.iterdir() if (m := re.match(_SET_ASIDE_NAME, p.name))]


def pruning_dir(root: Path) -> Path:
    return root / PRUNING


def claim(root: Path, *, create: bool) -> str | None:
    """Why the workers may not keep checkpoints in `root` (a run's checkpoint folder), or None,
    after making it when `create` (rank 0). `checkpoint.dir` is often a shared scratch folder and
    `<checkpoint.dir>/<run id>` a name another user can compute: a folder they made there (or a
    link to one) could be swapped for their checkpoints, which resume would load, or hold a
    `.pruning` link through which the pruner deletes your files. So it must be this user's (or the
    trusted group's; `ownership`), and its parent must not let others replace it."""
    if create:
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            root.mkdir(mode=0o755)
        except FileExistsError:
            pass  # ours from an earlier attempt, or made meanwhile: checked below either way
    found = ownership.path_clause(root) or ownership.path_clause(pruning_dir(root))
    if found:
        return f"{found[1]}: refusing to keep checkpoints there; remove it or set checkpoint.dir to a folder of yours"
    loose = ownership.replaceable_by_others(root.parent)
    if loose:
        return f"{loose}: refusing to keep checkpoints in {root}; set checkpoint.dir to a folder of your own"
    return None


def set_aside_dir(root: Path) -> Path:
    return root / SET_ASIDE


def rng_name(rank: int) -> str:
    """A rank's RNG file, relative to its checkpoint (the key of its checksum)."""
    return f"{RNG_DIR}/rank{rank}.pt"


def rng_file(checkpoint: Path, rank: int) -> Path:
    return checkpoint / rng_name(rank)


def is_complete(path: Path) -> bool:
    return (path / DCP_METADATA).is_file() and (path / COMPLETE).is_file()


def reference_file(root: Path, role: str) -> Path:
    """The reference log-probs of a preference run's `role` pairs (worker/preference.py):
    computed once before the first step, read by every later attempt."""
    return root / "reference" / f"{role}.npz"


def read_meta(path: Path) -> dict[str, Any]:
    """A checkpoint's clusterfsdp.json (OSError, ValueError when unreadable or not a JSON object)."""
    meta = fileio.load_json(path / COMPLETE)
    if not isinstance(meta, dict):
        raise ValueError(f"{path / COMPLETE}: not a JSON object")
    return meta


def list_checkpoints(root: Path) -> list[CheckpointInfo]:
    """Complete checkpoints, oldest first (pure Python: used by status, the TUI and export)."""
    out = []
    if root.is_dir():
        for p in root.iterdir():
            m = re.match(_STEP, p.name)
            if m and is_complete(p):
                try:
                    meta = read_meta(p)
                except (OSError, ValueError):
                    continue
                out.append(CheckpointInfo(p, int(m.group(1)), meta))
    return sorted(out, key=lambda c: c.step)


def find(root: Path, step: int | None = None) -> CheckpointInfo | None:
    """The newest complete checkpoint, or the one at `step`."""
    found = list_checkpoints(root)
    if step is not None:
        found = [c for c in found if c.step == step]
    return found[-1] if found else None


BEST_STEP = "best_step"  # clusterfsdp.json: the step of the lowest eval loss so far (0: none)
BENCH_BEST = ".bench-best.json"  # {"metric", "step", "value"}: keep_best on a benchmark score


def best(root: Path, keep_best: str = "eval_loss") -> CheckpointInfo | None:
    """The best checkpoint by checkpoint.keep_best: for an eval metric as the newest checkpoint
    records it, for a benchmark score ('bench/...') as `.bench-best.json` does (for that score:
    one recorded for another is not it); None when none is recorded or it is gone."""
    found = list_checkpoints(root)
    if keep_best.startswith("bench/"):
        try:
            record = fileio.load_json(root / BENCH_BEST)
        except (OSError, ValueError):
            record = None
        step = record.get("step") if isinstance(record, dict) and record.get("metric") == keep_best else None
    else:
        step = found[-1].meta.get(BEST_STEP) if found else None
    return next((c for c in found if c.step == step), None) if type(step) is int and step > 0 else None


def beyond_keep(root: Path, keep_last: int, keep_best: str) -> list[Path]:
    """The complete checkpoints `keep_last` lets go: all but the newest `keep_last` and, with
    checkpoint.keep_best, the best, and none that a benchmark evaluation has yet to read (`hold`).
    The holds are read before the best: an evaluation records a new best, then releases its hold
    (control/benchrun.py), so a checkpoint whose result just landed is seen held or seen best."""
    held = held_steps(root)
    found = list_checkpoints(root)
    kept = best(root, keep_best) if keep_best else None
    return [c.path for c in found[:-keep_last] if (kept is None or c.step != kept.step) and c.step not in held]


def hold(root: Path, step: int) -> None:
    """Keep checkpoint `step` from keep_last until `release`: its benchmark evaluation is queued."""
    (root / f"{_HOLD}{step}").touch()


def release(root: Path, step: int) -> None:
    """The evaluation has read checkpoint `step` (or given up): keep_last may let it go at the next save."""
    (root / f"{_HOLD}{step}").unlink(missing_ok=True)


def held_steps(root: Path) -> set[int]:
    try:
        names = os.listdir(root)
    except OSError:
        return set()
    return {int(n[len(_HOLD) :]) for n in names if n.startswith(_HOLD) and n[len(_HOLD) :].isdigit()}


def set_aside(checkpoint: Path, why: str = "") -> Path:
    """Move one checkpoint into `set-aside/` (never deleted; no longer found nor counted by
    keep_last) as `step-N[-why]-T`, T the time in seconds, or the next free second after it: the
    same step set aside twice within a second (a resume that made it again that fast) must keep
    both, where a rename onto the first failed (a folder) or replaced it (a file); returns where it went."""
    label = f"-{why}" if why else ""
    folder = set_aside_dir(checkpoint.parent)
    folder.mkdir(exist_ok=True)
    t = int(time.time())
    while True:
        dest = folder / f"{checkpoint.name}{label}-{t}"
        t += 1
        if os.path.lexists(dest):
            continue
        try:
            os.rename(checkpoint, dest)
        except OSError as e:  # taken meanwhile by another process's set-aside (a folder there)
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                continue
            raise
        return dest


def keep_only_up_to(root: Path, step: int) -> list[tuple[Path, Path]]:
    """Move complete checkpoints newer than `step` into `set-aside/`, so a resume picks `step`.
    Returns (original, new) paths, so that the move can be undone."""
    return [(info.path, set_aside(info.path)) for info in list_checkpoints(root) if info.step > step]
