"""The node's watchdog: one small torch-free process per node of an attempt, started by the node's
first rank (`worker.heartbeat.start_node_watchdog`), ending when that rank ends.

    python -m clusterfsdp.worker.watchdog RUN_DIR JOB_ID RESTART WORLD_SIZE PARENT_PID SETTINGS_JSON

Why a process per node and not a thread of rank 0: a thread stops with its process (a SIGSTOPped
rank 0 would take the watchdog with it), and only a process on the same node can read a rank's
stacks (py-spy) or kill it. Every node's watchdog reads every rank's heartbeat from the shared
run folder (core/health.py) and applies the same rule (`health.find_hang`), so any node that
still runs notices; they agree through files in `diagnostics/<job>.<restart>/`:

1. the first to decide creates `hang.json` (O_EXCL: exactly one wins);
2. every watchdog that sees it dumps the stacks of its node's ranks into `rank<R>.txt` (py-spy
   `dump`, `--nonblocking` for a stopped process, whose memory it reads without ptrace-stopping it;
   without py-spy, faulthandler through DUMP_SIGNAL into the rank log, copied), then writes
   `dumped.<host>.json` with the ranks' process states (R, S, T stopped, D uninterruptible);
3. the winner waits for every node's dump (at most DUMP_WAIT_S), appends the `hang` event (the
   ranks, their hosts, and in `failed_nodes` the nodes the evidence points at: a rank in D state,
   or a node whose watchdog never answered), then writes `recorded`;
4. each watchdog then SIGKILLs its node's ranks (a stopped process too): srun ends the step, the
   batch script's job step classifies the attempt as `hang` (control.outcomes) and submits the
   next one from the last checkpoint, without the suspect nodes.

On CUDA the NCCL flight recorder is on (worker/distenv.py: TORCH_FR_BUFFER_SIZE and a dump path
under diagnostics/); NCCL writes it itself when a collective times out (untested here: no GPU).

Stragglers: the watchdog on rank 0's node also compares the ranks' own step times
(`health.stragglers`); a rank behind on straggler_checks polls in a row gets one `straggler`
event per attempt and a warning line in rank 0's log. No restart.

Cost: one poll every max(BEAT_S, world_size / 200) s reads the heartbeat files (small, on the
shared file system); nothing in the training processes.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..core import fileio, health, runfolder
from ..core.health import Beat, Hang, WatchdogSettings
from ..core.records import Event, EventKind

# The stack dump each rank's heartbeat registers faulthandler on (py-spy missing): here, in the
# torch-free process that sends it, which the rank-side heartbeat.py imports.
DUMP_SIGNAL = signal.SIGRTMIN + 3  # unused by Slurm, NCCL, submitit
DUMP_WAIT_S = 30.0  # the winner waits this long for every node's stack dumps
RECORD_WAIT_S = 45.0  # the others wait this long for the hang event before they kill anyway
PYSPY_TIMEOUT_S = 20.0
WATCHDOG_RANK = -2  # the `rank` of events a watchdog writes about several ranks (jobstep's are -1)


class NodeWatchdog:
    def __init__(self, run_path: Path, job_id: str, restart: int, world_size: int, settings: WatchdogSettings):
        self.run = runfolder.RunFolder(run_path)
        self.job_id, self.restart, self.world_size, self.settings = job_id, restart, world_size, settings
        self.beats_dir = health.health_dir(run_path, job_id, restart)
        self.diag = health.diagnostics_dir(run_path, job_id, restart)
        self.host = socket.gethostname()
        self.behind: dict[int, int] = {}  # straggler polls in a row, by rank
        self.reported: set[int] = set()

    @property
    def poll_s(self) -> float:
        return max(health.BEAT_S, self.world_size / 200)

    def watch(self, parent: int) -> None:
        while os.getppid() == parent:
            if self.check(time.time()):
                return
            time.sleep(self.poll_s)

    def check(self, now: float) -> bool:
        """One poll; True once a hang was handled (the watchdog's work is done)."""
        beats = health.read_beats(self.beats_dir)
        marker = self.diag / "hang.json"
        if marker.exists():
            self.handle(beats, won=False)
            return True
        found = health.find_hang(beats, self.world_size, self.settings, now)
        if found is not None:
            self.diag.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self.handle(beats, won=False)
                return True
            with os.fdopen(fd, "w") as f:
                json.dump({"ranks": found.ranks, "hosts": found.hosts, "reason": found.reason, "by": self.host}, f)
            self.handle(beats, won=True, found=found)
            return True
        if beats.get(0) is not None and beats[0].host == self.host:
            self.watch_stragglers(beats)
        return False

    # ---------------------------------------------------------------- a hang
    def handle(self, beats: dict[int, Beat], won: bool, found: Hang | None = None) -> None:
        mine = {r: b for r, b in beats.items() if b.host == self.host}
        states = {r: _state(b.pid) for r, b in mine.items()}
        for rank, beat in sorted(mine.items()):
            self.dump(rank, beat, states[rank])
        done = self.diag / f"dumped.{self.host}.json"
        fileio.atomic_write(done, json.dumps({"host": self.host, "states": states}))
        if won and found is not None:
            self.record(beats, found)
        else:
            _wait_for(lambda: (self.diag / "recorded").exists(), RECORD_WAIT_S)
        # the node's first rank (our parent) last: its death ends this process (PR_SET_PDEATHSIG)
        for beat in sorted(mine.values(), key=lambda b: b.pid == os.getppid()):
            _kill(beat.pid)

    def record(self, beats: dict[int, Beat], found: Hang) -> None:
        hosts = {b.host for b in beats.values()}
        _wait_for(lambda: all((self.diag / f"dumped.{h}.json").exists() for h in hosts), DUMP_WAIT_S)
        suspect: set[str] = set()
        for host in hosts:
            path = self.diag / f"dumped.{host}.json"
            try:
                states = json.loads(path.read_text())["states"]
            except (OSError, ValueError, KeyError):
                suspect.add(host)  # its watchdog never answered: the node itself is frozen or gone
                continue
            if any(state == "D" for state in states.values()):
                suspect.add(host)  # a rank stuck in the kernel (a device, a file system): the node
        exclude = sorted(suspect) if len(suspect) < len(hosts) else []
        states = ", ".join(f"rank {r}: {_state_word(_state_of(self.diag, beats[r].host, r))}" for r in found.ranks
                           if r in beats)  # fmt: skip
        reason = found.reason + (f"; process state {states}" if states else "")
        if exclude:
            reason += f"; suspect node(s) {', '.join(exclude)} excluded from the next attempt"
        first = found.ranks[0] if found.ranks else WATCHDOG_RANK
        event = Event(EventKind.HANG, self.job_id, self.restart, first, found.hosts[0] if found.hosts else "",
                      time.time(), reason=reason[:1000], ranks=list(found.ranks), failed_nodes=exclude)  # fmt: skip
        self.run.append_event(event)
        print(f"clusterfsdp watchdog: hang: {reason}", flush=True)
        (self.diag / "recorded").touch()

    def dump(self, rank: int, beat: Beat, state: str) -> None:
        """rank<R>.txt: py-spy's dump of every thread, else faulthandler's (via the rank log)."""
        out = self.diag / f"rank{rank}.txt"
        pyspy = _pyspy()
        if pyspy is not None:
            argv = [pyspy, "dump", "--pid", str(beat.pid)] + (["--nonblocking"] if state == "T" else [])
            try:
                r = subprocess.run(argv, capture_output=True, text=True, timeout=PYSPY_TIMEOUT_S)
                text = r.stdout if r.returncode == 0 else f"py-spy failed ({r.returncode}): {r.stderr}"
            except (OSError, subprocess.TimeoutExpired) as e:
                text = f"py-spy failed: {e}"
            fileio.atomic_write(out, text)
            return
        if state in ("T", "D", "?"):
            fileio.atomic_write(out, f"rank {rank} (pid {beat.pid}) is in state {state}: faulthandler cannot run "
                                        "in it; install py-spy to read its stack\n")  # fmt: skip
            return
        log = self.run.log_path(self.job_id, self.restart, rank)
        start = log.stat().st_size if log.is_file() else 0
        try:
            os.kill(beat.pid, DUMP_SIGNAL)
        except OSError:
            return
        time.sleep(2.0)
        with open(log, "rb") as f:
            f.seek(start)
            fileio.atomic_write(out, f.read(1 << 20).decode("utf-8", errors="replace"))

    # ---------------------------------------------------------------- stragglers
    def watch_stragglers(self, beats: dict[int, Beat]) -> None:
        slow = health.stragglers(beats, self.settings)
        self.behind = {r: self.behind.get(r, 0) + 1 for r in slow}
        for rank, polls in self.behind.items():
            if polls < self.settings.straggler_checks or rank in self.reported:
                continue
            self.reported.add(rank)
            b = beats[rank]
            reason = (f"rank {rank} on {b.host} is a straggler: it reaches the others {slow[rank]:.3f} s late per step "
                      f"(steps take {b.step_s:.3f} s; step {b.step}, {polls} checks in a row)")  # fmt: skip
            self.run.append_event(Event(EventKind.STRAGGLER, self.job_id, self.restart, rank, b.host, time.time(),
                                        step=b.step, reason=reason, ranks=[rank]))  # fmt: skip
            line = f"[watchdog] warning: {reason}\n"
            try:
                with open(self.run.log_path(self.job_id, self.restart, 0), "a") as f:
                    f.write(line)
            except OSError:
                pass
            print(line, end="", flush=True)


def _pyspy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def _state(pid: int) -> str:
    """The process state letter from /proc (R running, S sleeping, T stopped, D uninterruptible,
    Z zombie); '?' when gone or unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def _state_of(diag: Path, host: str, rank: int) -> str:
    try:
        return json.loads((diag / f"dumped.{host}.json").read_text())["states"][str(rank)]
    except (OSError, ValueError, KeyError):
        return "?"


_STATES = {"R": "running", "S": "sleeping", "T": "stopped (SIGSTOP)", "t": "traced", "D": "uninterruptible (D)",
           "Z": "zombie", "?": "unknown"}  # fmt: skip


def _state_word(state: str) -> str:
    return _STATES.get(state, state)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)  # also ends a stopped process; a D-state one dies when it leaves the kernel
    except OSError:
        pass


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return predicate()


def main(argv: list[str]) -> int:
    run_dir, job_id, restart, world, parent, settings = argv
    dog = NodeWatchdog(Path(run_dir), job_id, int(restart), int(world), WatchdogSettings(**json.loads(settings)))
    # Slurm's time-limit signal and a preemption's SIGTERM reach every process of the step: the
    # ranks then save (a save can hang too) and the watchdog ends with its rank, not before.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    dog.watch(int(parent))
    return 0


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process the moment its parent (the node's first rank) dies, so a
    cancelled step leaves no watchdog behind for the poll's 2 s (nor at all where the step's
    processes are not tracked by cgroup); elsewhere the poll of getppid() is the rule."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
