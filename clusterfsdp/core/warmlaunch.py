"""Asking a warm launcher to start the local executor's controller (issue 36).

The local executor's controller (`worker.warmctl`) imports torch, transformers and the worker
before it forks the ranks: about 4 s of CPU for every local attempt. A warm launcher is a process
of the same user that has imported them once and forks such processes on request over a Unix
socket (a `worker.warmstart.Launcher` behind a socket; the tests' rank server, tests/rankserver.py,
is one). When `CLUSTERFSDP_LAUNCHER` names its socket, `core.localctl.RecordingExecutor` asks it
first; it starts the controller itself, as before, whenever the socket is absent, is another
user's (SO_PEERCRED), answers that the controller must start cold (the launcher starts nothing it
cannot start as a new interpreter would: its own rule) or fails in any way.

The request is one message: JSON `{"argv", "env", "cwd", "umask", "session": true}` with this
process's fds 0-2 (SCM_RIGHTS) as the new process's stdin, stdout and stderr. The answer is
`{"pid": N, "forked": bool}` with a pidfd, or `{"cold": why}`, or `{"error": why}`. A served
controller leads a session of its own (`session`), so the attempt's process group is its own and
`cancel` signals it as it signals the group of a controller started here.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from collections.abc import Mapping, Sequence

ENV_LAUNCHER = "CLUSTERFSDP_LAUNCHER"  # the socket of a warm launcher of this user
ANSWER_S = 30.0  # a launcher that takes longer to fork is stuck: start cold


def start(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int | None, str]:
    """(pid, '') of `argv` started by the launcher `env` names, in a session of its own, in this
    process's working folder and umask, on this process's fds 0-2; (None, why not) if it did not."""
    path = env.get(ENV_LAUNCHER, "")
    if not path:
        return None, f"{ENV_LAUNCHER} is not set"
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.settimeout(ANSWER_S)
        conn.connect(path)
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.getuid():
            return None, f"the launcher at {path} runs as uid {uid}, not this user's"
        mask = os.umask(0o022)
        os.umask(mask)
        request = {"argv": list(argv), "env": dict(env), "cwd": os.getcwd(), "umask": mask, "session": True}
        socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
        data, fds, _, _ = socket.recv_fds(conn, 65536, 1)
        for fd in fds:
            os.close(fd)  # (the pidfd: the launcher reaps its child, this process only reports its pid)
        answer = json.loads(data) if data else {"error": "the launcher closed the connection"}
    except (OSError, ValueError) as e:
        return None, f"the launcher at {path} did not answer: {e}"
    finally:
        conn.close()
    if "pid" in answer:
        return int(answer["pid"]), ""
    return None, str(answer.get("cold") or answer.get("error") or "no answer")
