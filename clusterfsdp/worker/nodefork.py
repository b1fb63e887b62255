"""A Slurm node's sibling ranks forked from the node's first task (issue 36): every srun task is
a fresh interpreter that imports torch, transformers and the worker (3.5-4 s of CPU each), so a
node with N tasks paid for the imports N times. Here the node's first task (SLURM_LOCALID 0)
imports once and forks the rank of each other task from itself, as the local executor's
controller forks its ranks (worker/warmstart.py); each other task stays what srun started, a
small process (`Sibling`) that hands its stdin, stdout, stderr, environment, working folder,
umask and CPU mask to the first task, waits for its rank, and ends as the rank ended (its
outcome returned to submitit, its exit status, the signal that killed it).

Nothing changes in what Slurm sees and does: the tasks are srun's, each writes its own result
file, every process of the step is still in the step (a forked rank is the first task's child),
and a signal Slurm sends the step (a time limit's SIGUSR2, a cancel's SIGTERM) reaches the
forked rank directly, as it reaches every process of the step: a waiting task does not pass it
on (its handlers, the worker's stop flags, only take note), and when the waiting task itself is
killed its rank kills itself (it watches the connection's end-of-file).

Used only where a forked rank is exactly a cold one:
- a Slurm job step with more than one task on this node, outside a container;
- no GPU device on the node (/dev/nvidia*): per-task GPU binding (device cgroups,
  CUDA_VISIBLE_DEVICES per task) stays what Slurm made it, so GPU nodes start every task cold;
- no SLURM_MEM_BIND* (a task's NUMA memory policy is not carried over; its CPU mask is);
- the tasks' environments differ only in the per-task variables (`PER_TASK`);
- forking is safe in the first task after its imports (`warmstart.fork_problem`), and
  CLUSTERFSDP_COLD_START is not 1.
Otherwise, and whenever the first task does not answer within `CONNECT_S` (or stops gathering
after `GATHER_S`), a task starts its rank cold, as before.

The rendezvous is an abstract Unix socket named by user, job, restart, step and node (nothing on
disk to clean up; on the devcluster each node is a network namespace of its own, so each has
its own names); both ends check with SO_PEERCRED that the other is the same user. Messages are
JSON on a SOCK_SEQPACKET connection: the task's request (with its fds 0-2, SCM_RIGHTS), then
`{"pid"}` or `{"cold": why}`; at its end the rank sends `{"outcome"}`, `{"exit": code}` or
`{"error"}` itself, and the first task's reaper `{"code"}` (-N: signal N) once it has reaped it.
"""

from __future__ import annotations

import atexit
import glob
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from ..core.records import RankOutcome
from . import warmstart
from .distenv import DistEnv

CONNECT_S = 20.0  # a task waits this long for its node's first task to listen
GATHER_S = 30.0  # the first task, its imports done, waits this long for the node's other tasks
# What differs from one task of a node to the next in a step: forked ranks may differ in these
# only (a value read at import time, by the first task, must be the same for all of them).
PER_TASK = frozenset({"SLURM_PROCID", "SLURM_LOCALID", "SLURM_TASK_PID", "PMI_RANK", "PMIX_RANK"})
# What an unset variable means: slurmstepd sets TMPDIR=/tmp for a node's first task only.
UNSET = {"TMPDIR": "/tmp"}
_CREDS = struct.Struct("3i")


@dataclass(frozen=True)
class Node:
    """This task's place among the tasks of its node in a job step."""

    name: str  # the abstract socket's name (without the leading NUL)
    local_rank: int
    local_tasks: int

    @classmethod
    def of(cls, dist: DistEnv, env: Mapping[str, str]) -> Node | None:
        """The node's rendezvous, or None when this task starts cold (module docstring)."""
        if dist.launcher != "slurm" or dist.local_world_size < 2 or "SLURM_PROCID" not in env:
            return None
        if warmstart.launcher is not None:  # a rank forked already (by this node's first task)
            return None
        if env.get(warmstart.ENV_COLD) == "1" or "SLURM_CONTAINER" in env or not hasattr(os, "fork"):
            return None
        if any(k.startswith("SLURM_MEM_BIND") for k in env) or glob.glob("/dev/nvidia[0-9]*"):
            return None
        node = env.get("SLURMD_NODENAME") or socket.gethostname()
        name = f"clusterfsdp-{os.getuid()}-{dist.job_id}.{dist.restart}.{env.get('SLURM_STEP_ID', '')}-{node}"
        if len(name) > 100:  # (an abstract name has at most 107 bytes)
            name = f"clusterfsdp-{hashlib.sha256(name.encode()).hexdigest()[:40]}"
        return cls(name, dist.local_rank, dist.local_world_size)

    @property
    def first(self) -> bool:
        return self.local_rank == 0

    @property
    def address(self) -> bytes:
        return b"\0" + self.name.encode()


def env_difference(mine: Mapping[str, str], theirs: Mapping[str, str]) -> list[str]:
    """The variables, other than the per-task ones, in which two tasks' environments differ."""
    keys = (set(mine) | set(theirs)) - PER_TASK
    return sorted(k for k in keys if mine.get(k, UNSET.get(k)) != theirs.get(k, UNSET.get(k)))


def _peer_uid(conn: socket.socket) -> int:
    return _CREDS.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size))[1]


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    try:
        conn.send(json.dumps(message).encode())
    except OSError:
        pass


# ---------------------------------------------------------------- the other tasks
class Sibling:
    """A task whose rank the node's first task forked: `result` waits for it and ends as it
    ended."""

    def __init__(self, conn: socket.socket, pid: int):
        self.conn, self.pid = conn, pid

    @classmethod
    def ask(cls, node: Node) -> Sibling | None:
        """This task's rank forked by the node's first task, or None: start it cold."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        deadline = time.monotonic() + CONNECT_S
        while True:
            try:
                conn.connect(node.address)
                break
            except (ConnectionRefusedError, FileNotFoundError):
                if time.monotonic() > deadline:
                    conn.close()
                    return None
                time.sleep(0.05)
            except OSError:
                conn.close()
                return None
        try:
            if _peer_uid(conn) != os.getuid():
                conn.close()
                return None
            mask = os.umask(0o022)
            os.umask(mask)
            request = {"env": dict(os.environ), "cwd": os.getcwd(), "umask": mask,
                       "affinity": sorted(os.sched_getaffinity(0)), "argv": _own_argv()}  # fmt: skip
            socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
            conn.settimeout(None)
            answer = json.loads(conn.recv(65536) or b"{}")
        except (OSError, ValueError):
            conn.close()
            return None
        if "pid" not in answer:
            conn.close()
            if answer.get("cold"):
                print(f"cold start: {answer['cold']}", file=sys.stderr, flush=True)
            return None
        return cls(conn, int(answer["pid"]))

    def result(self) -> RankOutcome:
        """The rank's outcome when it returned one; otherwise this process ends as the rank
        did: its exit status, its error (raised again, for submitit's result file: the rank
        recorded it itself) or the signal that killed it."""
        end: dict[str, Any] = {}
        code: int | None = None
        previous = signal.signal(signal.SIGINT, lambda *_: None)  # the rank gets the step's SIGINT itself
        try:
            # the reaper's status is the last word (a process the rank forked may hold the end open)
            while code is None:
                try:
                    data = self.conn.recv(65536)
                except InterruptedError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    break
                message = json.loads(data)
                if "code" in message:
                    code = int(message["code"])
                else:
                    end = message
        finally:
            signal.signal(signal.SIGINT, previous)
            self.conn.close()
        if "outcome" in end:
            return RankOutcome(end["outcome"])
        if "error" in end:
            raise RuntimeError(f"rank (pid {self.pid}, forked by this node's first task) failed: {end['error']}")
        if "exit" in end:
            sys.exit(end["exit"])
        if code is not None and code < 0:  # killed by a signal: so is this task
            if -code not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
            sys.exit(128 - code)
        sys.exit(1 if code is None else code)


def _own_argv() -> list[str]:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return [os.fsdecode(a) for a in f.read().split(b"\0")[:-1]]
    except OSError:
        return list(sys.argv)


# ---------------------------------------------------------------- the first task
class Gathering:
    """The first task's listening socket, bound before its imports so that the other tasks find
    it at once; `fork_ranks` after the imports."""

    def __init__(self, node: Node, sock: socket.socket):
        self.node, self.sock = node, sock
        self.environ = dict(os.environ)  # as srun gave it (the job's [env] and the rank's variables come later)

    @classmethod
    def listen(cls, node: Node) -> Gathering | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.bind(node.address)
            sock.listen(node.local_tasks)
        except OSError:  # (taken: another process of this name; the others then fail its check)
            sock.close()
            return None
        return cls(node, sock)

    def fork_ranks(self, body: Callable[[], RankOutcome]) -> None:
        """Fork the rank of each other task that asks within GATHER_S, then stop listening. In a
        forked child this does not return: it becomes that task's rank, runs `body` (the worker's
        `run`) and exits as a new interpreter would."""
        warmstart._probe_fork()  # (OpenBLAS's threads from numpy's and scipy's imports stop)
        keep = warmstart._open_fds() - {self.sock.fileno()}
        problem = warmstart.fork_problem()
        children: list[tuple[int, socket.socket]] = []
        deadline, asked = time.monotonic() + GATHER_S, 0
        try:
            while asked < self.node.local_tasks - 1 and (left := deadline - time.monotonic()) > 0:
                self.sock.settimeout(left)
                try:
                    conn, _ = self.sock.accept()
                except (TimeoutError, OSError):
                    break
                asked += 1
                pid = self._answer(conn, keep, problem, children, body)
                if pid is None:
                    conn.close()
                else:
                    children.append((pid, conn))
        finally:
            self.sock.close()
        for pid, conn in children:  # (after every fork: no thread may exist at a fork)
            threading.Thread(target=_reap, args=(pid, conn), name=f"clusterfsdp-reap-{pid}", daemon=True).start()

    def _answer(self, conn: socket.socket, keep: set[int], problem: str,
                children: list[tuple[int, socket.socket]], body: Callable[[], RankOutcome]) -> int | None:  # fmt: skip
        """Read one task's request and fork its rank (the pid), or tell it to start cold (None)."""
        fds: list[int] = []
        try:
            conn.settimeout(5.0)
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            conn.settimeout(None)
            request = json.loads(data)
            why = problem or self._refusal(conn, request, fds)
        except (OSError, ValueError) as e:
            why = f"the request could not be read ({e})"
        if why:
            _send(conn, {"cold": why})
            for fd in fds:
                os.close(fd)
            return None
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            for stream in (sys.stdout, sys.stderr):
                if stream is not None:
                    stream.flush()
            try:
                pid = os.fork()
            except OSError as e:
                _send(conn, {"cold": f"fork failed: {e}"})
                return None
            if pid == 0:
                try:
                    others = [c.fileno() for _, c in children]
                    _become(request, fds, keep | {conn.fileno()}, others, conn)
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                except BaseException as e:
                    os.write(2, f"warm start: setting up the forked rank failed: {e!r}\n".encode())
                    os._exit(1)
                _run_to_the_end(conn, body)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            for fd in fds:
                os.close(fd)
        _send(conn, {"pid": pid})
        return pid

    def _refusal(self, conn: socket.socket, request: Mapping[str, Any], fds: list[int]) -> str:
        if _peer_uid(conn) != os.getuid():
            return "another user's request"
        if len(fds) != 3:
            return "the request did not carry stdin, stdout and stderr"
        different = env_difference(self.environ, request["env"])
        if different:
            return f"its environment differs from the first task's in {', '.join(different[:5])}"
        return ""


def _become(request: Mapping[str, Any], fds: list[int], keep: set[int], others: list[int], conn: socket.socket) -> None:
    """The forked child made into the asking task's rank (warmstart's list, and the task's
    working folder, umask and CPU mask)."""
    for fd in others:
        os.close(fd)
    os.chdir(request["cwd"])
    os.umask(int(request["umask"]))
    os.sched_setaffinity(0, request["affinity"])
    warmstart._become(fds, keep, request["env"], request["argv"])
    threading.Thread(target=_die_with_task, args=(conn,), name="clusterfsdp-task-watch", daemon=True).start()


def _die_with_task(conn: socket.socket) -> None:
    """The waiting task never writes after its request: end-of-file means it is gone (killed),
    and so is its rank, as a cold rank killed with its task."""
    watch = conn.dup()
    watch.settimeout(None)
    try:
        if watch.recv(1):
            return
    except ConnectionError:
        pass
    except OSError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def _run_to_the_end(conn: socket.socket, body: Callable[[], RankOutcome]) -> NoReturn:
    """Run the rank and end this process as `python -m` would end it (non-daemon threads
    joined, atexit handlers run, streams flushed), then its end sent to the waiting task;
    never back into the first task's frames."""
    code, end, interrupted = 0, {}, False
    task = os.environ.get("SLURM_PROCID")
    print(
        f"warm start: the rank of task {task} (pid {os.getpid()}) was forked by this node's first task "
        f"(pid {warmstart.launcher}), which imported torch and transformers",
        file=sys.stderr,
        flush=True,
    )
    try:
        end = {"outcome": str(body())}
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
        end = {"exit": code}
    except KeyboardInterrupt:
        interrupted = True
    except BaseException as e:  # (`run` printed and recorded it)
        code, end = 1, {"error": " ".join(f"{type(e).__name__}: {e}".split())[:2000]}
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:  # as Python ends on an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    _send(conn, end)
    os._exit(code)


def _reap(pid: int, conn: socket.socket) -> None:
    """In the first task, one thread per forked rank: its exit status to its waiting task when
    it ends (a daemon thread: the first task's own end does not wait for its siblings, and a
    rank it did not reap reaches its task as the end-of-file after the rank's own last word)."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        conn.close()
        return
    _send(conn, {"code": os.waitstatus_to_exitcode(status)})
    conn.close()
