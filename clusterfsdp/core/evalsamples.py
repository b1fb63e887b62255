"""What the model generated at an evaluation (`[eval] samples`): `<run>/samples/step-<N>.jsonl`,
one `EvalSample` a line. Rank 0 writes a step's file whole (temp file + rename, so a reader never
sees half of one); `status`, the TUI's run screen and the notebook read the newest. Torch-free:
the worker (`worker/generate.py`) and the control plane share this one definition.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

from .fileio import atomic_write, read_jsonl
from .value import value

_FILE = r"^step-(\d+)\.jsonl$"


@value(frozen=True)
class EvalSample:
    """One prompt and what the model generated from it greedily at `step`."""

    step: int
    prompt: str
    completion: str

    @classmethod
    def from_json(cls, row: dict) -> EvalSample | None:
        """None for a row that is not one (an older or foreign file is skipped, not fatal)."""
        step, prompt, completion = row.get("step"), row.get("prompt"), row.get("completion")
        if not isinstance(step, int) or not isinstance(prompt, str) or not isinstance(completion, str):
            return None
        return cls(step, prompt, completion)


def path(samples_dir: Path, step: int) -> Path:
    return samples_dir / f"step-{step}.jsonl"


def write(samples_dir: Path, step: int, samples: list[EvalSample]) -> Path:
    """The step's samples as one file, replaced whole (a repeated step after a resume overwrites)."""
    samples_dir.mkdir(exist_ok=True)
    out = path(samples_dir, step)
    atomic_write(out, "".join(json.dumps(asdict(s), ensure_ascii=False) + "\n" for s in samples))
    return out


def steps(samples_dir: Path) -> list[int]:
    """The steps that have samples, ascending."""
    try:
        names = [p.name for p in samples_dir.iterdir()]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(m.group(1)) for n in names if (m := re.match(_FILE, n)))


def read(samples_dir: Path, step: int) -> list[EvalSample]:
    return [s for row in read_jsonl(path(samples_dir, step)) if (s := EvalSample.from_json(row)) is not None]


def latest(samples_dir: Path) -> list[EvalSample]:
    """The newest evaluation's samples; [] when there is none yet."""
    found = steps(samples_dir)
    return read(samples_dir, found[-1]) if found else []
