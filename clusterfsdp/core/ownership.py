"""Whom files on a shared file system are trusted from: one rule for run folders (commands that
act on a run, `runfolder.refusal`) and for the prepared-data cache (`data/trust`). Trusted: owned
by you, or carrying the group named by $CLUSTERFSDP_TRUSTED_GROUP; writable by nobody else (not
by every user, and by its group only when that group is the trusted one or your own primary
group). docs/run-folder.md says why."""

from __future__ import annotations

import enum
import grp
import os
import pwd
import stat
from pathlib import Path

from .errors import UserError

ENV_TRUSTED_GROUP = "CLUSTERFSDP_TRUSTED_GROUP"


class Untrusted(enum.Enum):
    """Why another user could have written a file."""

    OWNER = "owner"  # neither yours nor the trusted group's
    WORLD_WRITABLE = "world-writable"
    GROUP_WRITABLE = "group-writable"  # by a group that is neither trusted nor your own


def trusted_group() -> int | None:
    """The group id named by $CLUSTERFSDP_TRUSTED_GROUP (a name or a number); None when unset or
    unknown (an unknown group trusts nobody)."""
    value = os.environ.get(ENV_TRUSTED_GROUP, "").strip()
    if not value:
        return None
    try:
        return int(value) if value.isdigit() else grp.getgrnam(value).gr_gid
    except KeyError:
        return None


def verdict(st: os.stat_result) -> Untrusted | None:
    """The rule, on a file's stat: None when only you (or the trusted group) could have written it."""
    group = trusted_group()
    if st.st_uid != os.geteuid() and not (group is not None and st.st_gid == group):
        return Untrusted.OWNER
    if st.st_mode & stat.S_IWOTH:
        return Untrusted.WORLD_WRITABLE
    if st.st_mode & stat.S_IWGRP and st.st_gid not in (group, os.getegid()):
        return Untrusted.GROUP_WRITABLE
    return None


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def stat_clause(path: object, st: os.stat_result) -> tuple[Untrusted, str] | None:
    """The rule on a stat, said: (why, '<path> belongs to <owner>, not to you ...'); None when only
    you (or the trusted group) could have written it. Callers add what they refuse and advise."""
    why = verdict(st)
    if why is None:
        return None
    owner = f"{user_name(st.st_uid)} (uid {st.st_uid})"
    mode = f"mode {stat.S_IMODE(st.st_mode):o}"
    if why is Untrusted.OWNER:
        return why, f"{path} belongs to {owner}, not to you or the trusted group (${ENV_TRUSTED_GROUP})"
    if why is Untrusted.WORLD_WRITABLE:
        return why, f"{path} (owner {owner}) is writable by every user ({mode})"
    return why, (
        f"{path} (owner {owner}) is writable by group {group_name(st.st_gid)} ({mode}), which is not the trusted "
        f"group (${ENV_TRUSTED_GROUP})"
    )


def path_clause(path: os.PathLike[str] | str) -> tuple[Untrusted, str] | None:
    """`stat_clause` of `path` and, for a symlink, of the link's owner first, then of its target
    (another user's link to your folder is refused too). None when it does not exist."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        found = stat_clause(path, st)
        if found and found[0] is Untrusted.OWNER:  # (a link's own mode is always 777 and means nothing)
            return found
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
    return stat_clause(path, st)


def replaceable_by_others(folder: os.PathLike[str] | str) -> str | None:
    """Why another user could rename an entry of `folder` away and put their own in its place: the
    folder is writable by them and has no sticky bit (/tmp and /scratch-style folders have it)."""
    try:
        st = os.stat(folder)
    except OSError:
        return None
    if st.st_mode & stat.S_ISVTX:
        return None
    why = verdict(st)
    if why in (Untrusted.WORLD_WRITABLE, Untrusted.GROUP_WRITABLE):
        found = stat_clause(folder, st)
        return f"{found[1] if found else folder} without the sticky bit, so others can replace what is in it"
    return None


class Refused(UserError):
    """A shared place another user could have written: one line naming it and its owner."""


def private_folder(parent: Path) -> Path:
    """`parent/<uid>`, mode 0700, for files whose every byte is read back as code or data by this
    user alone (submitit's pickles of a prepare array, datasets' copy of the rows): `parent` may
    be shared, but must not be another user's, nor may `<uid>` be."""
    parent.mkdir(parents=True, exist_ok=True)
    folder = parent / str(os.geteuid())
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    found = path_clause(parent) or path_clause(folder)
    if found:
        raise Refused(f"{found[1]}: refusing to use it; remove it or choose a folder of your own")
    if os.lstat(folder).st_mode & 0o077:
        os.chmod(folder, 0o700)
    return folder
