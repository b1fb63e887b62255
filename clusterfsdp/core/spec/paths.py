"""Job files and the paths in them: reading a job file, making its relative paths absolute
(relative to the file's folder, so the run's job.toml works from any directory on any node), and
telling a hub id (`org/name`, resolved at submit by `modelsource`/`data.checks`) from a local path.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

from .. import fileio
from ..runroot import default_run_root
from ..value import value
from .benchsection import is_local
from .codec import loads, override_label, override_of
from .schema import JobSpec, SpecError, short
from .tokenizer import chat_problem, default_tokenizer

MAX_JOB_FILE_BYTES = fileio.MAX_JOB_FILE_BYTES


def load(path: str | Path, overrides: Sequence[str] = ()) -> JobSpec:
    """A job file as a checked JobSpec with absolute paths. Every error line says where it comes
    from: the `--set KEY=VALUE` that gave the key it names, else the file."""
    return JobText.read(path).load(overrides)


@value(frozen=True)
class JobText:
    """A job's TOML text and the folder its relative paths are relative to: a job file read once
    (`read`), or a job that is no file (the TUI's compose form), whose `origin` is empty."""

    text: str
    base: Path
    origin: str = ""  # what error lines about keys no override set start with: the file's path

    @classmethod
    def read(cls, path: str | Path) -> JobText:
        p = Path(path)
        return cls(read_job_file(p), p.parent, str(p))

    def load(self, overrides: Sequence[str] = ()) -> JobSpec:
        """The job as a checked JobSpec with absolute paths (`load`)."""
        try:
            return with_absolute_paths(loads(self.text, overrides), self.base)
        except SpecError as e:
            raise SpecError([self._origin(line, overrides) for line in e.errors]) from None

    def _origin(self, line: str, overrides: Sequence[str]) -> str:
        if line.startswith("--set ") or (self.origin and line.startswith(self.origin)):  # says where already
            return line
        item = override_of(line, overrides)
        if item is not None:
            return f"{override_label(item)}: {line}"
        return f"{self.origin}: {line}" if self.origin else line


def read_job_file(p: Path) -> str:
    """The text of a job file: a regular file of at most MAX_JOB_FILE_BYTES of UTF-8, read without
    blocking or reading without bound (a FIFO, a device, /dev/zero are refused before reading:
    `fileio.open_regular`)."""
    try:
        data = fileio.read_bytes(p, MAX_JOB_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SpecError([f"{p}: no such file"]) from None
    except IsADirectoryError:
        raise SpecError([f"{p}: is a folder, not a job file"]) from None
    except fileio.NotRegularFile as e:
        raise SpecError([f"{p}: {e.strerror}; a job file is a .toml file"]) from None
    except OSError as e:  # no permission, a loop of symlinks, a name too long, EIO
        raise SpecError([f"{p}: cannot read: {e.strerror or e}"]) from None
    if len(data) > MAX_JOB_FILE_BYTES:
        raise SpecError([f"{p}: larger than {MAX_JOB_FILE_BYTES >> 20} MiB; a job file is a few KB of TOML"])
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise SpecError([f"{p}: cannot read: not UTF-8 text ({e.reason} at byte {e.start})"]) from None


def with_absolute_paths(spec: JobSpec, base: Path) -> JobSpec:
    """Relative paths in a job file are relative to the file's folder; make them absolute so the
    resolved job.toml in the run folder works from any directory on any node."""
    errors: list[str] = []

    def absolute(key: str, path: str) -> str:
        if not path:
            return path
        try:
            full = (base / Path(path).expanduser()).resolve()
        except (OSError, ValueError, RuntimeError) as e:  # a loop of symlinks, an unknown ~user
            errors.append(f"{key}: {short(path)} is not a usable path ({e.__class__.__name__})")
            return path
        if len(str(full).encode()) > 4095 or any(len(part.encode()) > 255 for part in full.parts):
            errors.append(f"{key}: {short(path)} is longer than a path may be (255 bytes a name, 4095 in all)")
        return str(full)

    def source(key: str, value: str) -> str:
        """A folder relative to the job file becomes absolute; a hub id (org/name) stays as written."""
        if not value:
            return value
        try:
            local = value.startswith((".", "/", "~")) or (base / value).exists()
        except (OSError, ValueError):  # too long for a path: not a folder here
            local = False
        return absolute(key, value) if local else value

    out = dataclasses.replace(spec)
    run_root = absolute("job.run_root", spec.job.run_root) if spec.job.run_root else str(default_run_root(base))
    out.job = dataclasses.replace(spec.job, run_root=run_root)

    def data_path(key: str, path: str) -> str:
        """Absolute, except a hub id that is not a local path (resolved at submit, not here)."""
        return path if looks_like_hub_id(path) and not (base / path).exists() else absolute(key, path)

    out.data = dataclasses.replace(
        spec.data,
        paths=[data_path(f"data.paths[{i}]", x) for i, x in enumerate(spec.data.paths)],
        sources=[
            dataclasses.replace(s, path=data_path(f"data.sources[{i}].path", s.path))
            for i, s in enumerate(spec.data.sources)
        ],
        tokenizer=spec.data.tokenizer
        if spec.data.tokenizer in ("bytes", "auto")
        else source("data.tokenizer", spec.data.tokenizer),
        cache_dir=absolute("data.cache_dir", spec.data.cache_dir),
    )
    out.eval = dataclasses.replace(
        spec.eval,
        paths=[data_path(f"eval.paths[{i}]", x) for i, x in enumerate(spec.eval.paths)],
        samples_file=absolute("eval.samples_file", spec.eval.samples_file),
    )
    b = spec.benchmarks
    out.benchmarks = dataclasses.replace(
        b,
        tasks=[absolute(f"benchmarks.tasks[{i}]", t) if is_local(t) else t for i, t in enumerate(b.tasks)],
    )
    out.checkpoint = dataclasses.replace(spec.checkpoint, dir=absolute("checkpoint.dir", spec.checkpoint.dir))
    out.model = dataclasses.replace(
        spec.model,
        name_or_path=source("model.name_or_path", spec.model.name_or_path),
        config=source("model.config", spec.model.config),
    )
    reference = source("train.preference.reference_model", spec.train.preference.reference_model)
    out.train = dataclasses.replace(
        spec.train, preference=dataclasses.replace(spec.train.preference, reference_model=reference)
    )
    out = default_tokenizer(out)
    if problem := chat_problem(out):  # decided only now, with the model's folder
        errors.append(problem)
    if errors:
        raise SpecError(errors)
    return out


# A HuggingFace repo id 'org/name'; a local path has './', '/', '~', a glob or a data file suffix.
_HUB_ID = r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$"
_DATA_SUFFIX = r"\.(txt|jsonl|json|gz|zst|parquet|csv|arrow)$"


def looks_like_hub_id(path: str) -> bool:
    """'org/name' shaped, and not a data file name: a hub dataset (or model) id, resolved at submit."""
    return bool(re.match(_HUB_ID, path)) and ".." not in path and not re.search(_DATA_SUFFIX, path)
