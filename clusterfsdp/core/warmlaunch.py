"""Asking a warm launcher to start a process that imports torch (issue 36): the local executor's
controller, and the export of `clusterfsdp export`.

The local executor's controller (`worker.warmctl`) imports torch, transformers and the worker
before it forks the ranks, and an export (`worker.export`) imports them to read the checkpoint:
about 3.5-4 s of CPU each time. A warm launcher is a process of the same user that has imported
them once and forks such processes on request over a Unix socket (a `worker.warmstart.Launcher`
behind a socket; the tests' rank server, tests/rankserver.py, is one). When `CLUSTERFSDP_LAUNCHER`
names its socket, `core.localctl.RecordingExecutor` (`start`) and `control.run.Run.export` (`run`)
ask it first; they start the process themselves, as before, whenever the socket is absent, is
another user's (SO_PEERCRED), the caller runs inside a Slurm job (whose processes must stay in
its allocation), the launcher answers that the process must start cold (the launcher starts
nothing it cannot start as a new interpreter would: its own rule) or fails in any way.

The request is one message: JSON `{"argv", "env", "cwd", "umask", "session": true}` with this
process's fds 0-2 (SCM_RIGHTS) as the new process's stdin, stdout and stderr. The answer is
`{"pid": N, "forked": bool}` with a pidfd, or `{"cold": why}`, or `{"error": why}`; when the
process ends, the launcher (its parent, the only one that can reap it) sends `{"code": C}` on the
same connection, C as Popen's `returncode` (-N: signal N). A served process leads a session of
its own (`session`), so a controller's attempt has a process group of its own and `cancel`
signals it as it signals the group of a controller started here; `run` passes on the signals a
terminal or a job's end sends the waiting process (SIGINT, SIGTERM, SIGHUP), which no longer
reach the served process through a process group.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

ENV_LAUNCHER = "CLUSTERFSDP_LAUNCHER"  # the socket of a warm launcher of this user
ANSWER_S = 30.0  # a launcher that takes longer to fork is stuck: start cold
PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what `run` sends on to the served process


def start(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int | None, str]:
    """(pid, '') of `argv` started by the launcher `env` names, in a session of its own, in this
    process's working folder and umask, on this process's fds 0-2; (None, why not) if it did not."""
    conn, pidfd, answer = _request(argv, env)
    if conn is not None:
        conn.close()  # (the launcher reaps its child; this process only reports its pid)
        os.close(pidfd)
    return (int(answer["pid"]), "") if "pid" in answer else (None, _why(answer))


def run(argv: Sequence[str], env: Mapping[str, str]) -> int | None:
    """`argv` run to its end by the launcher `env` names (as `start` starts it), with SIGINT,
    SIGTERM and SIGHUP sent on to it while this process waits: its exit status (-N: signal N);
    None when the launcher did not start it (the caller starts it itself). If the launcher ends
    before the process does, -1."""
    conn, pidfd, _ = _request(argv, env)
    if conn is None:
        return None
    try:
        with _passed_on(pidfd):
            conn.settimeout(None)
            data = conn.recv(4096)
        return int(json.loads(data)["code"]) if data else -1
    except (OSError, ValueError, KeyError):
        return -1
    finally:
        conn.close()
        os.close(pidfd)


def _request(argv: Sequence[str], env: Mapping[str, str]) -> tuple[socket.socket | None, int, dict]:
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
        socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
        data, fds, _, _ = socket.recv_fds(conn, 65536, 1)
        answer = json.loads(data) if data else {"error": "the launcher closed the connection"}
    except (OSError, ValueError) as e:
        conn.close()
        return None, -1, {"error": f"the launcher at {path} did not answer: {e}"}
    if "pid" in answer and len(fds) == 1:
        return conn, fds[0], answer
    for fd in fds:
        os.close(fd)
    conn.close()
    return None, -1, answer if "pid" not in answer else {"error": "the launcher sent no pidfd"}


def _why(answer: Mapping) -> str:
    return str(answer.get("cold") or answer.get("error") or "no answer")


@contextmanager
def _passed_on(pidfd: int) -> Iterator[None]:
    """Inside: PASSED_ON signals to this process go to the process of `pidfd` instead (only the
    main thread can set handlers; elsewhere they keep theirs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def send_on(sig: int, _frame: object) -> None:
        try:
            signal.pidfd_send_signal(pidfd, sig)
        except ProcessLookupError:
            pass

    before = {sig: signal.signal(sig, send_on) for sig in PASSED_ON}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
