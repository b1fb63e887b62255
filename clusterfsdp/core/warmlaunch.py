"""Asking a warm launcher to start a process that imports torch (issue 36): the local executor's
controller, the export of `clusterfsdp export`, a notebook's local supervisor and `data show` (from
the CLI and the TUI's Data view, which import transformers' tokenizers).

The local executor's controller (`worker.warmctl`) and the notebook's local supervisor
(`notebook.tasks _local`) import torch, transformers and the worker before they fork the ranks,
and an export (`worker.export`) imports them to read the checkpoint: 3.5-4.5 s of CPU each time. A
warm launcher is a process of the same user that has imported them once and forks such processes
on request over a Unix socket (a `worker.warmstart.Launcher` behind a socket; the tests' rank
server, tests/rankserver.py, is one). When `CLUSTERFSDP_LAUNCHER` names its socket,
`core.localctl.RecordingExecutor` (`start`), `control.run.Run.export` (`call`),
`control.backends.LocalRanks` (`popen`), `cli/datacmds.cmd_data_show` (`call`) and
`tui/data_screen.start_reader` (`popen`) ask it first; they start the process themselves, as
before, whenever the socket is absent, is another user's (SO_PEERCRED), the caller runs inside a
Slurm job (whose processes must stay in its allocation), the launcher answers that the process must
start cold (the launcher starts nothing it cannot start as a new interpreter would: its own rule)
or fails in any way.

The request is one message: JSON `{"argv", "env", "cwd", "umask", "session": true}` with three fds
(SCM_RIGHTS) as the new process's stdin, stdout and stderr (this process's 0-2, or the caller's
pipes). The answer is `{"pid": N, "forked": bool}` with a pidfd, or `{"cold": why}`, or
`{"error": why}`; when the process ends, the launcher (its parent, the only one that can reap it)
sends `{"code": C}` on the same connection, C as Popen's `returncode` (-N: signal N): `Served` is
the caller's Popen-like handle. A served process leads a session of its own (`session`), so a
controller's or supervisor's attempt has a process group of its own and `cancel` signals it as it
signals the group of one started here; `run` passes on the signals a terminal or a job's end sends
the waiting process (SIGINT, SIGTERM, SIGHUP), which no longer reach the served process through a
process group. A served process is not its caller's child: a parent-death signal cannot stop it
(control/backends.py gives the notebook's supervisor a pipe whose end-of-file says the kernel is
gone).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import IO, Any

ENV_LAUNCHER = "CLUSTERFSDP_LAUNCHER"  # the socket of a warm launcher of this user
ANSWER_S = 30.0  # a launcher that takes longer to fork is stuck: start cold
PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what `run` sends on to the served process


def start(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int | None, str]:
    """(pid, '') of `argv` started by the launcher `env` names, in a session of its own, in this
    process's working folder and umask, on this process's fds 0-2; (None, why not) if it did not."""
    served, why = popen(argv, env)
    if served is None:
        return None, why
    served.detach()  # (the launcher reaps its child; this process only reports its pid)
    return served.pid, ""


def run(argv: Sequence[str], env: Mapping[str, str]) -> int | None:
    """`argv` run to its end by the launcher `env` names (as `start` starts it), with SIGINT,
    SIGTERM and SIGHUP sent on to it while this process waits: its exit status (-N: signal N);
    None when the launcher did not start it (the caller starts it itself). If the launcher ends
    before the process does, -1."""
    served, _ = popen(argv, env)
    if served is None:
        return None
    with _passed_on(served._signal):
        return served.wait()


def call(argv: Sequence[str]) -> int:
    """`argv` run to its end on this process's fds 0-2, its exit status: by the launcher this
    process's environment names (`run`), else started here as `subprocess.call` starts it. The
    export and `data show` are run so."""
    code = run(argv, os.environ)
    return subprocess.call(argv) if code is None else code


class Served:
    """A process a launcher forked for this one, used as a `subprocess.Popen` is: `pid`, `poll`,
    `wait` (TimeoutExpired), `returncode` (-N: signal N), `send_signal`, `terminate`, `kill`, and
    `stdout` when the caller made it a pipe's read end. The exit status is the launcher's message
    on the connection (only the launcher can reap it; -1 if the launcher ended first: `_gone`);
    signals go through the pidfd, which never names a reused pid."""

    stdin = None
    stderr = None

    def __init__(self, pid: int, conn: socket.socket, pidfd: int, stdout: IO[Any] | None = None):
        self.pid, self.stdout = pid, stdout
        self.args: list[str] = []
        self.returncode: int | None = None
        self._conn: socket.socket | None = conn
        self._pidfd = pidfd
        self._lock = threading.Lock()  # the connection and the pidfd; a poll never waits for a wait

    def poll(self) -> int | None:
        if self.returncode is None and self._lock.acquire(blocking=False):
            try:
                self._receive(0.0)
            finally:
                self._lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:  # (in slices: a signal sent meanwhile takes the lock between them)
            left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            with self._lock:
                if self.returncode is None:
                    self._receive(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """As Popen's: nothing once the process is known to have ended."""
        self.poll()
        with self._lock:
            if self.returncode is None:
                self._signal(sig)

    def _signal(self, sig: int) -> None:
        """`sig` to the process now, without the lock: also from a handler in the thread that
        waits, which holds it (`run`)."""
        if self._conn is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def detach(self) -> None:
        """Stop following it (its status is not wanted): the connection and the pidfd closed."""
        with self._lock:
            self._close()

    def _gone(self) -> None:
        """The launcher closed the connection before it sent the status."""
        self.returncode = -1

    def _receive(self, timeout: float) -> None:
        if self._conn is None:
            return
        self._conn.settimeout(timeout)
        try:
            data = self._conn.recv(4096)
        except (TimeoutError, BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        try:
            if not data:
                self._gone()
            else:
                self.returncode = int(json.loads(data)["code"])
        finally:
            if self.returncode is not None:
                self._close()

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
            os.close(self._pidfd)


def popen(
    argv: Sequence[str], env: Mapping[str, str], fds: tuple[int, int, int] = (0, 1, 2)
) -> tuple[Served | None, str]:
    """(`argv` started by the launcher `env` names, '') with `fds` as its stdin, stdout and stderr
    (the caller sets `stdout` on the handle when fds[1] is a pipe's write end), in a session of
    its own, in this process's working folder and umask; (None, why not) if it did not start it."""
    conn, pidfd, answer = _request(argv, env, fds)
    if conn is None:
        return None, _why(answer)
    served = Served(int(answer["pid"]), conn, pidfd)
    served.args = list(argv)
    return served, ""


def _request(
    argv: Sequence[str], env: Mapping[str, str], fds: tuple[int, int, int] = (0, 1, 2)
) -> tuple[socket.socket | None, int, dict]:
    """(the open connection, the pidfd, the answer) of a started process, else (None, -1, the
    answer: {"cold"} or {"error"} saying why)."""
    path = env.get(ENV_LAUNCHER, "")
    if not path:
        return None, -1, {"error": f"{ENV_LAUNCHER} is not set"}
    if job := env.get("SLURM_JOB_ID"):  # a launcher outside the allocation would run it outside the job's limits
        return None, -1, {"error": f"inside Slurm job {job}: its processes stay in the job"}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.settimeout(ANSWER_S)
        conn.connect(path)
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.getuid():
            conn.close()
            return None, -1, {"error": f"the launcher at {path} runs as uid {uid}, not this user's"}
        mask = os.umask(0o022)
        os.umask(mask)
        request = {"argv": list(argv), "env": dict(env), "cwd": os.getcwd(), "umask": mask, "session": True}
        socket.send_fds(conn, [json.dumps(request).encode()], list(fds))
        data, pidfds, _, _ = socket.recv_fds(conn, 65536, 1)
        answer = json.loads(data) if data else {"error": "the launcher closed the connection"}
    except (OSError, ValueError) as e:
        conn.close()
        return None, -1, {"error": f"the launcher at {path} did not answer: {e}"}
    if "pid" in answer and len(pidfds) == 1:
        return conn, pidfds[0], answer
    for fd in pidfds:
        os.close(fd)
    conn.close()
    return None, -1, answer if "pid" not in answer else {"error": "the launcher sent no pidfd"}


def _why(answer: Mapping) -> str:
    return str(answer.get("cold") or answer.get("error") or "no answer")


@contextmanager
def _passed_on(send: Callable[[int], None]) -> Iterator[None]:
    """Inside: PASSED_ON signals to this process are given to `send` instead (only the main
    thread can set handlers: elsewhere they keep theirs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def send_on(sig: int, _frame: object) -> None:
        send(sig)

    before = {sig: signal.signal(sig, send_on) for sig in PASSED_ON}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
