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
