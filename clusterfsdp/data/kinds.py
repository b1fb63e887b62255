"""The kinds of source a job's data paths may name, and the sources those paths name.

A kind is a `data.filekind.FileKind` in its own module; KINDS lists them in the order they are
tried on a path (the first that recognises it wins: a folder is a saved dataset before it is any
dataset folder). Adding a kind is its module and a line here. Everything else asks a source's
kind (`of`): validate's checks (`data.checks`), prepare's planning (`data.units`) and reading
(`data.readers`). Pure Python (the control plane imports it)."""

from __future__ import annotations

from pathlib import Path

from ..core import spec as specmod
from . import hfdatasets, jsonlfile, parquetfile, txtfile
from .filekind import FileKind
from .sources import Compression, Source, TooBroad, matches

KINDS: dict[str, FileKind] = {
    kind.name: kind for kind in (txtfile.KIND, jsonlfile.KIND, parquetfile.KIND, hfdatasets.SAVED, hfdatasets.FOLDER)
}
ACCEPTED = ".txt or .jsonl, either maybe .gz or .zst; .parquet; or a dataset folder"  # what KINDS take, in words
_COMPRESSIONS: dict[str, Compression] = {".gz": "gz", ".zst": "zst"}


def of(source: Source) -> FileKind:
    """The kind of a source found by `local_sources`."""
    return KINDS[source.kind]


def recognise(path: Path, is_dir: bool) -> tuple[FileKind, Compression] | None:
    """What `path` (a folder when `is_dir`) is as a source (None: not one). A glob may name a
    hundred thousand files: the folder test is the caller's, once per path."""
    name = path.name.lower()
    compression: Compression = ""
    suffix = next((s for s in _COMPRESSIONS if name.endswith(s)), "")
    if suffix and not is_dir:
        name, compression = name.removesuffix(suffix), _COMPRESSIONS[suffix]
    for kind in KINDS.values():
        if (kind.compressible or not compression) and kind.recognises(path, name, is_dir):
            return kind, compression
    return None


def local_sources(field: str, patterns: list[str]) -> tuple[list[Source], list[str]]:
    """The sources that local paths (globs allowed) name, and one error line per path that names
    none (or too much: TooBroad) and per match that cannot be read (a dangling or looping link, no
    permission, a FIFO or device). Every entry is a local path: hub ids must have been resolved
    to their local snapshot folder by the caller (the submitting host does that); an entry still
    shaped like a hub id is reported as such."""
    sources: list[Source] = []
    errors: list[str] = []
    for i, pattern in enumerate(patterns):
        key = field if field.endswith(".path") else f"{field}[{i}]"  # data.sources[i].path: one path
        try:
            found = matches(pattern)
        except TooBroad as e:
            errors.append(f"{key}: {e}")
            continue
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
            source, problem = _source(key, m)
            if problem:
                errors.append(f"{key}: {problem}")
            elif source is not None:
                sources.append(source)
    return sources, errors


def _source(key: str, match: str) -> tuple[Source | None, str]:
    """The source one match is, or the one-line problem (after the key) why it is none."""
    try:
        path = Path(match).resolve(strict=True)
        is_dir = path.is_dir()
        found = recognise(path, is_dir)
        regular = is_dir or path.is_file()
    except (OSError, RuntimeError) as e:  # RuntimeError: a loop of symlinks (Python 3.11's resolve)
        reason = e.strerror if isinstance(e, OSError) and e.strerror else "a loop of symbolic links"
        return None, f"{match}: cannot read: {reason}"
    if found is None or not regular:
        what = "not a regular file (a FIFO, socket or device); " if not regular else ""
        return None, f"{path}: {what}not a data source ({ACCEPTED})"
    kind, compression = found
    source = Source(key, str(path), kind.name, compression, kind.folder)
    if source.is_folder:
        try:
            source.files()
        except TooBroad as e:
            return None, str(e)
    return source, ""
