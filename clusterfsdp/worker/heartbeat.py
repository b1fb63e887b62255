"""This rank's heartbeat (core/health.py has the file and the rules): what the training
thread tells at each step and phase change, written every BEAT_S seconds by a side thread, and
the collective timeout that follows the same rule as the watchdog.

Cost: at a step the training thread reads the clock three times and appends to two deques
(microseconds, bench/watchdog_bench.py); the file is written by the side thread, not per step.
The first rank of each node also starts the node's watchdog (`worker/watchdog.py`, its own
process, so that it still runs when a rank is frozen).

Stacks on a hang come from py-spy (it reads a process from outside, also one that is stopped
or blocked in C code); where py-spy is missing, each rank has registered faulthandler on
DUMP_SIGNAL at start, writing into its own rank log, which the watchdog then copies (a frozen
process cannot run a handler: its file then says so).
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import IO

import torch.distributed as dist
from torch.distributed import distributed_c10d

from ..core import health
from ..core.health import Beat, Phase, WatchdogSettings
from .watchdog import DUMP_SIGNAL

RETIME_EVERY = 32  # steps between checks of the collective timeout


class Heartbeat:
    """One rank's progress, told by the training thread (`phase`, `step`, `waited`) and written
    by a daemon thread. `close` marks the rank done (the watchdog stops watching it)."""

    def __init__(self, run_path: Path, job_id: str, restart: int, rank: int, settings: WatchdogSettings,
                 log_path: Path | None = None):  # fmt: skip
        self.settings = settings
        self.folder = health.health_dir(run_path, job_id, restart)
        self.folder.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.beat = Beat(rank, socket.gethostname(), os.getpid(), job_id, restart, Phase.START_UP, 0, now, now)
        self._times: deque[float] = deque(maxlen=16)
        self._marks: deque[tuple[int, float, float]] = deque(maxlen=health.MARKS)
        self._fetched = 0.0
        self._last: float | None = None
        self._steps = 0
        self._timeout_s = 0.0
        self._dump_file: IO[str] | None = None
        if log_path is not None:  # the fallback without py-spy; kept open for the rest of the process
            self._dump_file = open(log_path, "a")  # noqa: SIM115
            faulthandler.register(DUMP_SIGNAL, file=self._dump_file, all_threads=True, chain=False)
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._loop, name="clusterfsdp-heartbeat", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- told by the training thread
    def phase(self, phase: Phase) -> None:
        """A new phase: progress now; the step clock restarts (a save or an eval is no step)."""
        self.beat.phase = phase
        self.beat.progress = time.time()
        self._last = None
        self.retime()

    def fetched(self) -> None:
        """The step's batches are read: the rank is about to enter the step's first collective."""
        self._fetched = time.time()

    def step(self, step: int) -> None:
        """After each optimizer step (the step's last collective is behind)."""
        now = time.perf_counter()
        if self._last is not None:
            self._times.append(now - self._last)
        self._last = now
        self.beat.step = step
        self.beat.progress = time.time()
        self._marks.append((step, self._fetched, self.beat.progress))
        self._steps += 1
        if self._steps % RETIME_EVERY == 2:  # the first measured step, then every RETIME_EVERY
            self.retime()

    def close(self) -> None:
        self.beat.phase = Phase.DONE
        self._stop.set()
        self._write()

    # ---------------------------------------------------------------- the side thread
    def _loop(self) -> None:
        while not self._stop.wait(health.BEAT_S):
            self._write()

    def _write(self) -> None:
        times = list(self._times)
        b = self.beat
        if times:
            times.sort()
            b.step_s = times[len(times) // 2]
            b.slowest_s = times[-1]
        b.marks = [list(m) for m in self._marks]
        b.beat = time.time()
        try:
            health.write_beat(self.folder, b)
        except OSError as e:  # a full or flaky file system must not stop training; the watchdog sees it stale
            print(f"[rank{b.rank}] heartbeat: {e}", file=sys.stderr, flush=True)

    # ---------------------------------------------------------------- the collective timeout
    def retime(self) -> None:
        """Set the default process group's timeout to the watchdog's rule plus a margin
        (health.collective_timeout_s) when it changed by more than a quarter. Once training is
        over (DONE: the comeback may wait minutes for a Slurm controller) the start-up one."""
        slowest = max(self._times, default=0.0)
        phase = Phase.START_UP if self.beat.phase is Phase.DONE else self.beat.phase
        want = health.collective_timeout_s(self.settings, phase, slowest)
        if abs(want - self._timeout_s) <= 0.25 * self._timeout_s:
            return
        if dist.is_initialized():
            distributed_c10d._set_pg_timeout(timedelta(seconds=want))
            self._timeout_s = want


def start_node_watchdog(run_path: Path, job_id: str, restart: int, world_size: int,
                        settings: WatchdogSettings) -> subprocess.Popen | None:  # fmt: skip
    """The node's watchdog process (worker/watchdog.py), started by the node's first rank; it
    ends when that rank does. Its lines go to `watchdog.<host>.log` beside the heartbeats."""
    argv = [sys.executable, "-m", "clusterfsdp.worker.watchdog", str(run_path), job_id, str(restart),
            str(world_size), str(os.getpid()), json.dumps(asdict(settings))]  # fmt: skip
    try:
        log = health.health_dir(run_path, job_id, restart) / f"watchdog.{socket.gethostname()}.log"
        with open(log, "a") as out:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    except OSError as e:
        print(f"watchdog: could not start ({e}); hangs fall back to the collective timeout", file=sys.stderr)
        return None
