"""The NFS-safe lock file and process identity: exclusive under real concurrent processes, stale
locks of dead owners broken exactly once, PID reuse never mistaken for the recorded process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterfsdp.core import lock, procs

RACE = """
import sys, time
from pathlib import Path
from clusterfsdp.core.lock import FileLock, LockHeld
path, start = Path(sys.argv[1]), float(sys.argv[2])
release = Path(sys.argv[3]) if len(sys.argv) > 3 else None
while time.time() < start:
    pass
try:
    FileLock(path, "race").acquire()
    print("got", flush=True)
    if release is None:
        time.sleep(1.5)
    else:  # hold it (alive) until every other process has tried, then exit without releasing
        deadline = time.time() + 120
        while not release.exists() and time.time() < deadline:
            time.sleep(0.05)
except LockHeld as e:
    print("held", e.owner.purpose if e.owner else None, flush=True)
"""


def test_of_many_concurrent_processes_exactly_one_gets_the_lock(tmp_path: Path):
    """Six processes start spinning at once. The winner stays alive until every other one has
    answered: a straggler that started late (a loaded machine) must meet a live owner, not the
    stale lock of a winner that already exited, which it would rightly break."""
    path, release = tmp_path / "run.lock", tmp_path / "release"
    start = time.time() + 1.0
    ps = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, str(path), str(start), str(release)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(6)
    ]
    try:
        firsts = [p.stdout.readline().strip() if p.stdout else "" for p in ps]  # "got" or "held ..."
    finally:
        release.touch()
    outs = [first + p.communicate(timeout=60)[0].strip() for first, p in zip(firsts, ps, strict=True)]
    assert sorted(outs) == ["got"] + ["held race"] * 5, outs


def test_a_dead_owners_lock_is_broken_and_a_live_owners_is_not(tmp_path: Path):
    path = tmp_path / "run.lock"
    holder = subprocess.Popen([sys.executable, "-c", RACE, str(path), "0"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "got"
    with pytest.raises(lock.LockHeld) as e:
        lock.FileLock(path, "second").acquire()
    assert e.value.owner is not None and e.value.owner.process.pid == holder.pid
    holder.send_signal(signal.SIGKILL)  # dies holding it: no release
    holder.wait()
    assert path.exists()
    with lock.held(path, "after") as mine:
        assert mine.held_by_me() and json.loads(path.read_text())["purpose"] == "after"
    assert not path.exists()


def test_another_hosts_lock_is_stale_only_once_its_heartbeat_stops(tmp_path: Path):
    path = tmp_path / "data.lock"
    record = {"pid": 1, "start": 1, "host": "other-node", "boot": "x", "acquired": time.time(), "purpose": "prepare"}
    path.write_text(json.dumps(record))
    with pytest.raises(lock.LockHeld, match="other-node"):
        lock.FileLock(path, stale_after_s=60).acquire()
    old = time.time() - 120
    os.utime(path, (old, old))
    with lock.held(path, "mine", stale_after_s=60):
        assert json.loads(path.read_text())["host"] != "other-node"


def test_a_heartbeat_keeps_a_long_hold_fresh(tmp_path: Path):
    path = tmp_path / "data.lock"
    with lock.held(path, "prepare", heartbeat_s=0.1):
        old = time.time() - 1000
        os.utime(path, (old, old))
        time.sleep(0.5)
        assert time.time() - path.stat().st_mtime < 5


def test_waiting_acquire_gets_the_lock_when_released(tmp_path: Path):
    path = tmp_path / "x.lock"
    holder = subprocess.Popen([sys.executable, "-c", RACE, str(path), "0"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "got"
    t0 = time.monotonic()
    with lock.held(path, "waiter", timeout_s=30):
        waited = time.monotonic() - t0
    holder.wait()
    assert waited > 0.5  # it really waited for the holder (which held 1.5 s) instead of breaking its lock


def test_process_identity_survives_pid_reuse():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    me = procs.ProcessId.of(child.pid)
    assert me.alive() and procs.group_alive(me)
    reused = procs.ProcessId(child.pid, me.start - 1, me.host, me.boot)  # same pid, another process's start
    assert not reused.alive() and not procs.group_alive(reused)
    assert not procs.signal_group(reused, signal.SIGTERM) and child.poll() is None
    assert procs.signal_group(me, signal.SIGTERM)
    child.wait(timeout=10)
    assert not me.alive() and not procs.group_alive(me)
    elsewhere = procs.ProcessId(os.getpid(), procs.start_ticks(os.getpid()) or 0, "other-node", me.boot)
    assert not elsewhere.alive()  # never judged (or signalled) from another host


def test_an_empty_or_unparseable_lock_is_stale_after_a_few_seconds_not_120(tmp_path: Path):
    """Reproduced: an empty `.lock` (its creator died between creating and writing it) blocked
    every command for 120 s. One older than lock.UNREADABLE_GRACE_S is broken at once; a younger
    one may still be being written, and is not."""
    path = tmp_path / "run.lock"
    old = time.time() - 2 * lock.UNREADABLE_GRACE_S
    for content in ("", "{not json", '{"pid": "x"}'):
        path.write_text(content)
        with pytest.raises(lock.LockHeld, match="unknown owner"):
            lock.FileLock(path, "young").acquire(timeout_s=0)
        os.utime(path, (old, old))
        with lock.held(path, "after") as mine:
            assert mine.held_by_me()
        assert not path.exists()


def test_a_filesystem_without_hard_links_still_gets_an_exclusive_lock(tmp_path: Path, monkeypatch):
    """The lock is linked into place whole; where link(2) is refused (some FUSE/CIFS mounts; the
    refusal is simulated here) it falls back to an exclusive create, still one owner at a time."""

    def no_links(*_args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(lock.os, "link", no_links)
    with lock.held(tmp_path / "run.lock", "first") as mine:
        assert mine.held_by_me()
        with pytest.raises(lock.LockHeld, match="first"):
            lock.FileLock(tmp_path / "run.lock", "second").acquire()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no draft left behind


# Each process contends for a fresh stale lock in each trial, from four threads that switch as
# often as the interpreter allows (breakers interleave at every step), and keeps what it won until
# `release` exists: a process that lags behind meets a live owner, never an exited one.
BREAK_RACE = """
import sys, threading, time
from pathlib import Path
from clusterfsdp.core.lock import FileLock, LockHeld
sys.setswitchinterval(1e-6)
folder, start, trials, release = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
kept = []
for trial in range(trials):
    got = []
    def contend(trial=trial, got=got):
        while time.time() < start + 0.05 * trial:
            pass
        lock = FileLock(folder / f"{trial}.lock", "race")
        try:
            got.append(lock.acquire())
        except LockHeld:
            pass
    threads = [threading.Thread(target=contend) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kept += got
    print(trial, len(got), flush=True)
while not release.exists():
    time.sleep(0.05)
"""


def _dead_owner_record() -> dict:
    """The owner record of a process of this machine that has exited (its lock is stale)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    record = {**procs.ProcessId.of(child.pid).record(), "acquired": time.time(), "purpose": "dead", "token": "d" * 16}
    child.kill()
    child.wait()
    return record


def test_of_many_processes_breaking_the_same_stale_lock_exactly_one_holds_it(tmp_path: Path):
    """Reproduced: two breakers that both judged a lock stale each moved aside whatever lay at
    its name, the second one the first one's fresh lock, and both then held it (4 of 15 trials).
    Six processes of four threads each break the same dead owner's lock, 40 times over (a
    fresh one each time): each time exactly one of the 24 gets it, and no claim is left behind."""
    trials, record = 40, json.dumps(_dead_owner_record())
    for trial in range(trials):
        (tmp_path / f"{trial}.lock").write_text(record)
    release, start = tmp_path / "release", time.time() + 1.5
    argv = [sys.executable, "-c", BREAK_RACE, str(tmp_path), str(start), str(trials), str(release)]
    ps = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(6)]
    try:
        lines = [[p.stdout.readline().split() for _ in range(trials)] if p.stdout else [] for p in ps]
    finally:
        release.touch()
    for p in ps:
        p.communicate(timeout=60)
    holders = [sum(int(got) for out in lines for t, got in out if int(t) == trial) for trial in range(trials)]
    assert holders == [1] * trials, holders
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{t}.lock" for t in range(trials)] + ["release"])


def test_a_lock_whose_folder_was_removed_while_held_releases_quietly(tmp_path: Path):
    """A prepare's unit locks live in its partial folder, which a failed prepare removes before
    the locks are released: releasing (which takes the claim beside the lock) must not raise."""
    folder = tmp_path / "claims"
    folder.mkdir()
    held = lock.FileLock(folder / "00000.lock", "unit").acquire()
    shutil.rmtree(folder)
    held.release()
    assert not folder.exists()
