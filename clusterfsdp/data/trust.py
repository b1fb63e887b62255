"""Whom the prepared-data cache trusts, and how a file proves it was not changed since it was
prepared. Pure Python (validate checks the cache too).

A cache folder may be shared (a team's scratch space), and its keys are hashes of public
inputs, so another user can compute a victim's key and prepare it first, rewrite a shard, or
plant a lock. Before any cache entry, lock, fingerprint table, partial prepare or sample index
is used, its owner and modes are checked (`problem`), by the rule the run folders follow: it
must belong to this user, or carry the trusted group named by $CLUSTERFSDP_TRUSTED_GROUP (a
group name or id: a team that shares one cache sets it); and it must not be writable by every
user, nor by its group unless that group is the trusted one or this user's own primary group.
Anything else is refused with one line naming the path and its owner (exit 2): the user
removes it or points `data.cache_dir` at a folder of their own.
Everything the cache writes gets explicit modes (`secure`), whatever the umask: 0644/0755, or
with a trusted group that group and 0664/2775, so a user's own entries always pass.

Every file of a prepared dataset is *sealed* in its manifest (or index meta): its size, xxh3
hash, inode and ctime (which no user can set). Opening a sealed file costs one fstat while the
identity matches; a file whose identity changed (rewritten, or the cache copied elsewhere) is
hashed once, and a content mismatch stops the job with the file named (`verify`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import xxhash

from ..core import ownership
from .sources import DataError

FILE_MODE, DIR_MODE = 0o644, 0o755


def stat_problem(path: Path, st: os.stat_result) -> str | None:
    """Why a file with this stat may not be trusted (None: it may; `ownership.stat_clause`)."""
    found = ownership.stat_clause(path, st)
    return _refusal(found) if found else None


def _refusal(found: tuple[ownership.Untrusted, str]) -> str:
    why, clause = found
    if why is ownership.Untrusted.OWNER:
        return f"{clause}: refusing to use it; remove it, or set data.cache_dir to a folder of your own"
    if why is ownership.Untrusted.GROUP_WRITABLE:
        return f"{clause}: refusing to use it; chmod g-w it or set ${ownership.ENV_TRUSTED_GROUP}"
    return f"{clause}: refusing to use it"


def problem(path: Path) -> str | None:
    """Why `path` (and, for a symlink, the link and its target) may not be trusted; None if it may
    or if it does not exist."""
    found = ownership.path_clause(path)
    return _refusal(found) if found else None


def require(*paths: Path) -> None:
    """DataError naming the first path that may not be trusted."""
    for path in paths:
        found = problem(path)
        if found:
            raise DataError(found)


def secure(path: Path | int) -> None:
    """Give a file or folder this cache creates its explicit modes (and the trusted group)."""
    st = os.stat(path) if isinstance(path, Path) else os.fstat(path)
    group = ownership.trusted_group()
    folder = stat.S_ISDIR(st.st_mode)
    mode = DIR_MODE if folder else FILE_MODE
    if group is not None:
        if st.st_gid != group:
            try:
                os.chown(path, -1, group)
            except PermissionError:
                raise DataError(
                    f"${ownership.ENV_TRUSTED_GROUP}: cannot give {path} the group {ownership.group_name(group)}: "
                    "you are not a member of it"
                ) from None
        mode |= 0o2020 if folder else 0o020
    os.chmod(path, mode)


def write(path: Path, text: str) -> None:
    """Write a file of the cache atomically (a temporary name, renamed), with its modes."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    secure(tmp)
    os.replace(tmp, path)


def mkdirs(path: Path) -> None:
    """`path` and its missing parents, each secured as it is created."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        p.mkdir(exist_ok=True)
        secure(p)


# ---------------------------------------------------------------- privacy
def readable_by_everyone(path: Path) -> bool:
    """Whether every user can read `path`: it is o+r and every folder above it o+x."""
    try:
        if not os.stat(path).st_mode & stat.S_IROTH:
            return False
        return all(os.stat(parent).st_mode & stat.S_IXOTH for parent in Path(path).resolve().parents)
    except OSError:
        return False


def keep_private(folder: Path, files: list[Path]) -> bool:
    """Prepared data is never more readable than its sources: when not every user can read one of
    `files` (a 0700 folder, umask 077), `folder` (a dataset being prepared, renamed into place whole)
    becomes enterable by its owner only, whatever the trusted group. True when it did."""
    if all(readable_by_everyone(f) for f in files):
        return False
    os.chmod(folder, 0o700)
    return True


def private_folder(parent: Path) -> Path:
    """`ownership.private_folder` under the cache: `parent` made as the cache makes its folders."""
    mkdirs(parent)
    try:
        return ownership.private_folder(parent)
    except ownership.Refused as e:
        raise DataError(str(e)) from None


# ---------------------------------------------------------------- seals
def file_hash(fd: int) -> str:
    h = xxhash.xxh3_128()
    offset = 0
    while chunk := os.pread(fd, 1 << 23, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


def seal(path: Path) -> dict[str, Any]:
    """What `verify` checks a file against later: size, content hash, and its identity now."""
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        return {"size": st.st_size, "xxh3": file_hash(fd), "ino": st.st_ino, "ctime_ns": st.st_ctime_ns}
    finally:
        os.close(fd)


def verify(fd: int, path: Path, sealed: dict[str, Any], dataset: Path) -> None:
    """DataError if the open file `fd` (of the prepared `dataset` folder) may not be trusted or
    is not what was sealed: one fstat while its identity is unchanged; a full hash otherwise."""
    st = os.fstat(fd)
    found = stat_problem(path, st)
    if found:
        raise DataError(found)
    if (st.st_size, st.st_ino, st.st_ctime_ns) == (sealed["size"], sealed["ino"], sealed["ctime_ns"]):
        return
    if st.st_size != sealed["size"] or file_hash(fd) != sealed["xxh3"]:
        raise DataError(
            f"{path} was modified after it was prepared (its size or xxh3 hash differs from the manifest's): "
            f"remove {dataset} and prepare again"
        )
