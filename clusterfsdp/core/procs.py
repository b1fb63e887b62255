"""Process identity: a pid (or process-group id) is only trusted together with the process's start
time and the machine's boot id, so that after PID reuse a stored id never makes `status` say
RUNNING for a finished run, and `cancel` never signals an unrelated process group.

A pid read from a file (state.json, a lock file) may be corrupt or planted: 0 and -1 make
`killpg` signal the caller's own group or every process it may signal, 1 is init, and one past
the kernel's pid_max cannot exist. `pid_problem` is the one check: such a ProcessId is never
alive, never signalled, and `status` says the record is invalid. `signal_group` also never
signals the caller's own process group (it is alive, so it is no invalid record: a lock held
by a group leader stays held)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from .value import value


def boot_id() -> str:
    """Changes at every reboot; pids of an earlier boot mean nothing."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_max() -> int:
    """The largest pid the kernel hands out (2**22 is the most it can be set to)."""
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 1 << 22


def pid_problem(pid: int) -> str | None:
    """Why `pid` (read from a file) may not be checked or signalled as a run's process, or None."""
    if pid <= 1:
        return f"pid {pid} is not a process a run can own"
    if pid > pid_max():
        return f"pid {pid} is beyond the kernel's pid_max"
    return None


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (which may contain spaces and ')')."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def hostname() -> str:
    """socket.gethostname() without importing socket (a start-up cost of every read-only command):
    on Linux both are the kernel's node name."""
    return os.uname().nodename


@value(frozen=True)
class ProcessId:
    """A process as recorded in the run folder: enough to recognise it again, on its own host."""

    pid: int
    start: int
    host: str
    boot: str

    @classmethod
    def of(cls, pid: int) -> ProcessId:
        return cls(pid, start_ticks(pid) or 0, hostname(), boot_id())

    @classmethod
    def from_record(cls, record: dict) -> ProcessId | None:
        try:
            return cls(int(record["pid"]), int(record["start"]), str(record["host"]), str(record["boot"]))
        except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: int(inf)
            return None

    @property
    def problem(self) -> str | None:
        """pid_problem of the recorded pid (a corrupt or planted record)."""
        return pid_problem(self.pid)

    def record(self) -> dict:
        return {"pid": self.pid, "start": self.start, "host": self.host, "boot": self.boot}

    @property
    def here(self) -> bool:
        """Recorded on this machine in this boot (only then can it be checked or signalled)."""
        return self.host == hostname() and self.boot == boot_id()

    def alive(self) -> bool:
        """The very process recorded is still running (not a zombie, not a reused pid)."""
        if not self.here or self.problem:
            return False
        fields = _stat_fields(self.pid)
        return fields is not None and fields[0] != "Z" and int(fields[19]) == self.start


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def group_alive(leader: ProcessId) -> bool:
    """The group led by `leader` still has live members, and its id was not reused: the leader is
    either itself alive, or gone while members of its group remain (the group id cannot be reused
    while any member lives)."""
    if not leader.here or leader.problem:
        return False
    if leader.alive():
        return True
    if start_ticks(leader.pid) is not None:  # the pid now belongs to another process
        return False
    return bool(group_members(leader.pid))


def signal_group(leader: ProcessId, sig: signal.Signals) -> bool:
    """Signal the group only if it is still the one recorded, and is not our own; True if a
    signal was sent (False too for a group we may not signal: another user's)."""
    if leader.pid == os.getpgrp() or not group_alive(leader):
        return False
    try:
        os.killpg(leader.pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True
