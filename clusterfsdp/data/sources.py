"""Which sources a job's data paths name. Pure Python (the control plane imports it).

A *source* is one file or folder that `data.paths` / `eval.paths` name (globs expanded):
.txt (one document per file), .jsonl (one record per line; also gzip and zstd compressed),
.parquet, a folder written by `datasets`' `save_to_disk`, or a folder `datasets.load_dataset`
reads. Paths here are local: hub dataset ids are resolved to local snapshot folders on the
submitting host before the checks see the spec (they refuse ids they still find).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from ..control import spec as specmod
from ..control.errors import UserError
from ..control.value import FrozenValue

SourceKind = Literal["txt", "jsonl", "parquet", "saved_dataset", "dataset_folder"]
Compression = Literal["", "gz", "zst"]


class DataError(UserError, ValueError):
    """Data that cannot be used; the message is one line naming the key, file and line or record."""


@dataclass(frozen=True, repr=False, eq=False)
class Source(FrozenValue):
    """One data file or dataset folder a job names, as found on this host."""

    field: str  # the job.toml key that named it, e.g. "data.paths[0]"
    path: str  # absolute
    kind: SourceKind
    compression: Compression = ""

    @property
    def is_folder(self) -> bool:
        return self.kind in ("saved_dataset", "dataset_folder")

    def files(self) -> list[Path]:
        """What its content is: the file, or every non-hidden file under the folder."""
        if not self.is_folder:
            return [Path(self.path)]
        root = Path(self.path)
        return sorted(
            p
            for p in root.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
        )

    def size(self) -> int:
        return sum(f.stat().st_size for f in self.files())

    @property
    def split_key(self) -> str:
        """The job.toml key that names the split read from it (eval data: eval.split)."""
        if self.field.startswith("data.sources["):  # its own split, else data.split
            return self.field.rsplit(".", 1)[0] + ".split"
        return "eval.split" if self.field.startswith("eval.") else "data.split"


def _kind(path: Path) -> tuple[SourceKind, Compression] | None:
    if path.is_dir():
        saved = (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()
        return ("saved_dataset" if saved else "dataset_folder"), ""
    name = path.name.lower()
    compression: Compression = ""
    if name.endswith(".gz"):
        name, compression = name[:-3], "gz"
    elif name.endswith(".zst"):
        name, compression = name[:-4], "zst"
    if name.endswith(".txt"):
        return "txt", compression
    if name.endswith(".jsonl"):
        return "jsonl", compression
    if name.endswith(".parquet") and not compression:
        return "parquet", ""
    return None


def matches(pattern: str) -> list[str]:
    """What one data path names on this host: a glob's matches, or the path if it exists."""
    expanded = os.path.expanduser(pattern)
    if any(c in pattern for c in "*?["):
        return sorted(glob.glob(expanded, recursive=True))
    return [expanded] if os.path.exists(expanded) else []


def local_sources(field: str, patterns: list[str]) -> tuple[list[Source], list[str]]:
    """The sources that local paths (globs allowed) name, and one error line per path that names
    none. Every entry is a local path: hub ids must have been resolved to their local snapshot
    folder by the caller (the submitting host does that); an entry still shaped like a hub id
    is reported as such."""
    sources: list[Source] = []
    errors: list[str] = []
    for i, pattern in enumerate(patterns):
        key = field if field.endswith(".path") else f"{field}[{i}]"  # data.sources[i].path: one path
        found = matches(pattern)
        if not found:
            if specmod.looks_like_hub_id(pattern):
                errors.append(
                    f"{key}: {pattern!r} is not a local path; hub dataset ids are resolved to a local folder "
                    "on the submitting host at submit (give the local path here)"
                )
            else:
                errors.append(f"{key}: {pattern!r} matches no file or folder")
            continue
        for m in found:
            path = Path(m).resolve()
            kind = _kind(path)
            if kind is None:
                errors.append(
                    f"{key}: {path}: not a data source (.txt or .jsonl, either maybe .gz or .zst; .parquet; "
                    "or a dataset folder)"
                )
                continue
            sources.append(Source(key, str(path), *kind))
    return sources, errors


def open_binary(path: str, compression: Compression, raw: IO[bytes] | None = None) -> IO[bytes]:
    """The decompressed bytes of a file (zstd across all frames); from `raw` when given (the
    caller closes it)."""
    if compression == "gz":
        import gzip  # here, not at import: start-up of `validate` (issue 25 item 3)

        return gzip.GzipFile(fileobj=raw, mode="rb") if raw is not None else gzip.open(path, "rb")  # type: ignore[return-value]
    if compression == "zst":
        import io

        import zstandard

        src = raw if raw is not None else open(path, "rb")  # noqa: SIM115 - closed with the reader
        reader = zstandard.ZstdDecompressor().stream_reader(src, read_across_frames=True, closefd=raw is None)
        return io.BufferedReader(reader, 1 << 20)  # type: ignore[arg-type]  (readline needs a buffered reader)
    return raw if raw is not None else open(path, "rb")
