"""What a source is, how a data path's glob is walked, and the error every data problem raises.
Pure Python (the control plane imports it).

A *source* is one file or folder that `data.paths` / `eval.paths` name (globs expanded), of one
of the kinds in `data.kinds` (which finds the sources of a job's paths: `local_sources`). Paths
here are local: hub dataset ids are resolved to local snapshot folders on the submitting host
before the checks see the spec (they refuse ids they still find).

Globs and folders are expanded by a bounded walk (`_Walk`): a data path names the data's own
files, so one that lists more than MAX_WALK_FOLDERS folders or finds more than MAX_WALK_FILES
files names most of a file system instead (`/usr/**/*.txt`, `/`) and is refused with one line.
`glob.glob` took minutes on `/usr/**/*.txt`: it followed /usr/bin/X11 -> . round and round; the
walk visits each folder once.
"""

from __future__ import annotations

import fnmatch
import gzip
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal

from ..core.errors import UserError
from ..core.value import value

Compression = Literal["", "gz", "zst"]


MAX_WALK_FOLDERS = 10_000  # folders one data path's glob (or dataset folder) may list
MAX_WALK_FILES = 100_000  # files it may name


class DataError(UserError, ValueError):
    """Data that cannot be used; the message is one line naming the key, file and line or record."""


class TooBroad(DataError):
    """A data path whose expansion passed MAX_WALK_FOLDERS or MAX_WALK_FILES (the message says
    which, and what to give instead; the caller adds the key)."""


@value(frozen=True)
class Source:
    """One data file or dataset folder a job names, as found on this host."""

    field: str  # the job.toml key that named it, e.g. "data.paths[0]"
    path: str  # absolute
    kind: str  # its `data.filekind.FileKind`'s name (data.kinds.KINDS)
    compression: Compression = ""
    is_folder: bool = False  # a folder of files (a dataset folder), not one file

    def files(self) -> list[Path]:
        """What its content is: the file, or every non-hidden file under the folder (symlinked
        folders not entered). TooBroad beyond MAX_WALK_FOLDERS / MAX_WALK_FILES."""
        if not self.is_folder:
            return [Path(self.path)]
        walk = _Walk(self.path)
        return sorted(Path(p) for p in walk.below(self.path, follow=False) if _is_file(p) and walk.found())

    def size(self) -> int:
        return sum(f.stat().st_size for f in self.files())

    @property
    def split_key(self) -> str:
        """The job.toml key that names the split read from it (eval data: eval.split)."""
        if self.field.startswith("data.sources["):  # its own split, else data.split
            return self.field.rsplit(".", 1)[0] + ".split"
        return "eval.split" if self.field.startswith("eval.") else "data.split"


def _is_file(path: str) -> bool:
    try:
        return os.path.isfile(path)
    except OSError:  # not permitted to look: not a file we can read
        return False


def _magic(part: str) -> bool:
    return any(c in part for c in "*?[")


class _Walk:
    """One data path's expansion, counting the folders it lists and the files it names (TooBroad
    past the caps); folders it cannot list are skipped, as glob skips them."""

    def __init__(self, what: str) -> None:
        self.what, self.folders, self.files = what, 0, 0

    def _too_broad(self, exceeded: str) -> TooBroad:
        return TooBroad(
            f"{self.what!r} {exceeded}: that is much more than a dataset; name the data's own folder or "
            "files (e.g. /data/corpus/**/*.jsonl), or give a large dataset as [[data.sources]] parts"
        )

    def found(self) -> bool:
        self.files += 1
        if self.files > MAX_WALK_FILES:
            raise self._too_broad(f"matches more than {MAX_WALK_FILES:,} files")
        return True

    def entries(self, folder: str, hidden: bool = False) -> list[os.DirEntry[str]]:
        """The entries of `folder` (hidden ones only with `hidden`); [] if it cannot be listed."""
        self.folders += 1
        if self.folders > MAX_WALK_FOLDERS:
            raise self._too_broad(f"walks more than {MAX_WALK_FOLDERS:,} folders")
        try:
            with os.scandir(folder or os.curdir) as it:
                return [e for e in it if hidden or not e.name.startswith(".")]
        except OSError:
            return []

    def below(self, folder: str, follow: bool, dirs_only: bool = False) -> Iterator[str]:
        """Every non-hidden entry under `folder` (depth first), folders only with `dirs_only`;
        symlinked folders entered with `follow`, as glob does, except a folder inside itself (a
        link to an ancestor: the walk would never end)."""
        try:
            st = os.stat(folder or os.curdir)
            start = frozenset({(st.st_dev, st.st_ino)})
        except OSError:
            start = frozenset()
        stack: list[tuple[str, frozenset[tuple[int, int]]]] = [(folder, start)]
        while stack:
            top, ancestors = stack.pop()
            for entry in self.entries(top):
                path = os.path.join(top, entry.name)
                try:
                    is_dir = entry.is_dir() and (follow or not entry.is_symlink())
                    st = entry.stat() if is_dir else None
                except OSError:  # not permitted to look, or a loop of links: not a folder to enter
                    is_dir, st = False, None
                if st is not None and (st.st_dev, st.st_ino) not in ancestors:
                    stack.append((path, ancestors | {(st.st_dev, st.st_ino)}))
                if is_dir or not dirs_only:
                    yield path

    def expand(self, pattern: str) -> list[str]:
        """glob.glob(pattern, recursive=True), bounded: `**` is any number of folders."""
        parts = [p for p in pattern.split(os.sep) if p]
        bases = [os.sep if pattern.startswith(os.sep) else ""]
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if part == "**":
                out = [b for b in bases if last or os.path.isdir(b or os.curdir)]
                out += [p for b in bases for p in self.below(b, follow=True, dirs_only=not last)]
            elif _magic(part):
                test, hidden = re.compile(fnmatch.translate(part)).match, part.startswith(".")  # as glob: .* only
                out = [os.path.join(b, e.name) for b in bases for e in self.entries(b, hidden)
                       if test(e.name) and (last or _is_dir(e))]  # fmt: skip
            else:
                out = [p for b in bases if (os.path.lexists if last else os.path.isdir)(p := os.path.join(b, part))]
            bases = sorted(set(out))
            if len(bases) > MAX_WALK_FILES:
                raise self._too_broad(f"matches more than {MAX_WALK_FILES:,} files")
        return bases


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def matches(pattern: str) -> list[str]:
    """What one data path names on this host: a glob's matches, or the path if it exists (a
    dangling or unreadable link too: the caller says why it cannot be read). TooBroad for a
    glob that walks or matches more than a dataset could."""
    expanded = os.path.expanduser(pattern)
    if _magic(pattern):
        return _Walk(pattern).expand(expanded)
    try:
        os.lstat(expanded)
    except FileNotFoundError:
        return []
    except OSError:  # there, but not ours to look at (a folder on its way we may not enter)
        pass
    return [expanded]


def open_binary(path: str, compression: Compression, raw: IO[bytes] | None = None) -> IO[bytes]:
    """The decompressed bytes of a file (zstd across all frames); from `raw` when given (the
    caller closes it)."""
    if compression == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb") if raw is not None else gzip.open(path, "rb")  # type: ignore[return-value]
    if compression == "zst":
        # zstandard only for a .zst file
        import zstandard

        src = raw if raw is not None else open(path, "rb")  # noqa: SIM115 - closed with the reader
        reader = zstandard.ZstdDecompressor().stream_reader(src, read_across_frames=True, closefd=raw is None)
        return io.BufferedReader(reader, 1 << 20)  # type: ignore[arg-type]  (readline needs a buffered reader)
    return raw if raw is not None else open(path, "rb")
