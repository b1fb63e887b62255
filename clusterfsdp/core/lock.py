"""A lock file that works on NFS, for runs (resume, cancel, submit into a run) and for preparing
a dataset once for all ranks and jobs.

`flock`/`fcntl` locks are unreliable across NFS clients (and vanish with a dead client's lease);
creating a file with O_CREAT|O_EXCL is atomic on NFSv3+ and local filesystems alike. The file
holds its owner (host, pid, process start time, boot id). A lock is stale, and is broken, when
its owner is on this machine and provably dead, or when its holder stopped refreshing it:
long holders (a dataset prepare) touch the file every `heartbeat_s` from a thread, and a lock
not touched for `stale_after_s` belongs to a dead host. The lock file is written whole under a
unique name and hard-linked into place, so it is never seen half-written. A lock file that names
no owner anyway (a hand-made file, one left by an older version, a full disk) is stale once it is
`UNREADABLE_GRACE_S` old.

Breaking is exact: processes that find the same stale lock contend for a claim named after that
very lock (its owner's unique token, or the inode and mtime of a record without one), created
exclusively, so exactly one goes on; it reads the lock again under the claim and moves it aside
only if it is still the one judged stale. A slower breaker then finds the claim taken, or a
different lock at the name (the winner's), and breaks nothing: moving aside whatever lay at the
name let two breakers each take it, both then holding the lock (4 trials in 15). `release`
removes its own lock under the same claim, so it never removes a lock that replaced it. A claim
is held for a few file operations; one older than CLAIM_STALE_S was left by a breaker that died.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from . import fileio
from .errors import UserError
from .procs import ProcessId
from .value import value

UNREADABLE_GRACE_S = 5.0
CLAIM_STALE_S = 30.0


class LockHeld(UserError, RuntimeError):
    """The lock belongs to a live owner; `owner` says who (None if unreadable)."""

    def __init__(self, path: Path, owner: LockOwner | None):
        self.path, self.owner = path, owner
        who = owner.describe() if owner else "an unknown owner"
        super().__init__(f"{path} is held by {who}")


@value(frozen=True)
class LockOwner:
    process: ProcessId
    acquired: float
    purpose: str

    def describe(self) -> str:
        age = time.time() - self.acquired
        return f"pid {self.process.pid} on {self.process.host} ({self.purpose}, for {age:.0f} s)"


class FileLock:
    """`with FileLock(path, purpose="resume"):` — non-blocking by default (`timeout_s=0`)."""

    def __init__(
        self,
        path: Path,
        purpose: str = "",
        *,
        stale_after_s: float = 120.0,
        heartbeat_s: float | None = None,
        takeover: Callable[[LockOwner], bool] | None = None,
    ):
        """`takeover(owner)` True: that owner's lock may be broken at once (e.g. a previous
        incarnation of the same Slurm job, which Slurm guarantees is gone)."""
        self.path, self.purpose = path, purpose
        self.stale_after_s, self.heartbeat_s, self.takeover = stale_after_s, heartbeat_s, takeover
        self._token = ""
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # ---- owner record
    def owner(self) -> LockOwner | None:
        seen = _look(self.path)
        return seen.owner if seen else None

    def _stale(self, seen: _Seen) -> bool:
        owner = seen.owner
        if owner is not None and self.takeover is not None and self.takeover(owner):
            return True
        if owner is None:
            return seen.idle > UNREADABLE_GRACE_S
        if owner.process.here:
            return not owner.process.alive()
        return seen.idle > self.stale_after_s  # another host: judged by the heartbeat

    # ---- acquire / release
    def _try_create(self) -> bool:
        self._token = secrets.token_hex(8)
        record = {
            **ProcessId.of(os.getpid()).record(),
            "acquired": time.time(),
            "purpose": self.purpose,
            "token": self._token,
        }
        # Written whole under a unique name, then hard-linked into place: link(2) is atomic and
        # fails if the name exists (NFSv3+ too), so a contender never reads a half-made lock.
        draft = self.path.with_name(f"{self.path.name}.new-{self._token}")
        draft.write_text(json.dumps(record) + "\n")
        try:
            os.link(draft, self.path)
        except FileExistsError:
            return False
        except OSError:  # a filesystem without hard links: exclusive create, then write
            return self._create_in_place(record)
        finally:
            draft.unlink(missing_ok=True)
        return True

    def _create_in_place(self, record: dict) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(record) + "\n")
        return True

    def _break_stale(self, seen: _Seen) -> bool:
        """Remove the stale lock `seen`, and only it (see the module's docstring). False when
        another process holds the claim on it: it is being broken (or released) right now."""
        with _claim(self.path, seen.identity) as claimed:
            if not claimed:
                return False
            now = _look(self.path)
            if now is not None and now.identity == seen.identity:
                aside = self.path.with_name(f"{self.path.name}.stale-{secrets.token_hex(4)}")
                with contextlib.suppress(FileNotFoundError):
                    os.rename(self.path, aside)
                    aside.unlink()
        return True

    def acquire(self, timeout_s: float | None = 0.0, poll_s: float = 0.2, *, wait_for_live: bool = True) -> FileLock:
        """Take the lock, waiting up to `timeout_s` (None: forever); raises LockHeld. With
        `wait_for_live=False` an owner known to be alive (on this machine) fails it at once, and
        only an owner that cannot be checked (another host) is waited for."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._try_create():
            seen = _look(self.path)
            if seen is None:
                continue  # released meanwhile: just try again
            if self._stale(seen):
                if not self._break_stale(seen):
                    time.sleep(0.01)  # another process is breaking it: a few file operations
                continue
            owner = seen.owner
            alive_here = owner is not None and owner.process.here and owner.process.alive()
            if (deadline is not None and time.monotonic() >= deadline) or (alive_here and not wait_for_live):
                raise LockHeld(self.path, owner)
            time.sleep(poll_s)
        if self.heartbeat_s:
            self._stop.clear()
            self._beat = threading.Thread(target=self._heartbeat, name=f"lock-heartbeat {self.path.name}", daemon=True)
            self._beat.start()
        return self

    def _heartbeat(self) -> None:
        assert self.heartbeat_s
        while not self._stop.wait(self.heartbeat_s):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def held_by_me(self) -> bool:
        seen = _look(self.path)
        return seen is not None and seen.identity == self._token != ""

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None
        if self._token:  # under the claim on it: a breaker judging it stale meanwhile waits, or has it
            with _claim(self.path, self._token) as claimed:
                if claimed and self.held_by_me():  # never remove a lock that was broken and re-taken
                    self.path.unlink(missing_ok=True)
        self._token = ""

    def __enter__(self) -> FileLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@value(frozen=True)
class _Seen:
    """A lock file as read once: its owner (None: unreadable), what identifies this very lock (the
    record's unique token; for a record without one, its inode and mtime) and how long it has
    not been touched."""

    owner: LockOwner | None
    identity: str
    idle: float


def _look(path: Path) -> _Seen | None:
    """The lock file at `path`, or None when there is none. A name that is not a regular file (a
    FIFO is never opened: `open_regular`; a dangling symlink) or holds no owner record is an
    unreadable lock."""
    try:
        with fileio.open_regular(path) as f:
            st, text = os.fstat(f.fileno()), f.read(64 << 10)
    except OSError:  # gone, or there but no regular file (a FIFO, a dangling symlink): unreadable
        try:
            st, text = os.lstat(path), b""
        except FileNotFoundError:
            return None
    owner, token = None, ""
    try:
        data = fileio.loads(text)
        process = ProcessId.from_record(data)
        if process is not None:
            owner = LockOwner(process, float(data["acquired"]), str(data.get("purpose", "")))
        token = data.get("token") if isinstance(data.get("token"), str) else ""
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
        pass
    return _Seen(owner, token or f"{st.st_ino}-{st.st_mtime_ns}", time.time() - st.st_mtime)


@contextlib.contextmanager
def _claim(path: Path, identity: str) -> Iterator[bool]:
    """Whether this process got the claim on the lock `identity` at `path` (created exclusively,
    removed on leaving). A claim older than CLAIM_STALE_S (its maker died) is removed, not given;
    none is given in a folder that no longer exists."""
    claim = path.with_name(f"{path.name}.break-{''.join(c for c in identity if c.isalnum() or c == '-')[:64]}")
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        got = True
    except FileExistsError:
        got = False
        with contextlib.suppress(OSError):
            if time.time() - claim.lstat().st_mtime > CLAIM_STALE_S:
                claim.unlink()
    except FileNotFoundError:  # the lock's folder is gone (a prepare's partial folder): so is the lock
        got = False
    try:
        yield got
    finally:
        if got:
            claim.unlink(missing_ok=True)


@contextlib.contextmanager
def held(path: Path, purpose: str, timeout_s: float = 0.0, **kwargs) -> Iterator[FileLock]:
    lock = FileLock(path, purpose, **kwargs).acquire(timeout_s)
    try:
        yield lock
    finally:
        lock.release()
