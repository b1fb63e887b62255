"""A stand-in rank for tests/test_warmstart.py: `python -u -m warm_probe HOW` prints what a rank
could tell about how it was started (environment, signal dispositions, open fds, stdio, argv,
numpy's and Python's random draws, objects frozen out of the collector), registers an atexit
line, then ends as HOW says: `ok`, `exit3` (SystemExit(3)), `error` (an exception), `interrupt`
(KeyboardInterrupt), `kill` (SIGKILL)."""

from __future__ import annotations

import atexit
import gc
import io
import json
import os
import random
import signal
import sys

import numpy


def report() -> dict:
    handlers = {}
    for sig in sorted(signal.valid_signals()):
        try:
            handlers[signal.Signals(sig).name] = repr(signal.getsignal(sig))
        except (ValueError, OSError):
            continue
    return {
        "argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]],
        "cmdline": open("/proc/self/cmdline", "rb").read().rstrip(b"\0").decode().split("\0"),
        "name": __name__,
        "env": dict(os.environ),
        "fds": sorted(os.listdir("/proc/self/fd")),
        "signals": handlers,
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "stdio": [
            (type(s.buffer).__name__, s.write_through, s.line_buffering, s.errors, s.encoding)
            for s in (sys.stdout, sys.stderr)
            if isinstance(s, io.TextIOWrapper)
        ],
        "stdin": type(sys.stdin.buffer).__name__,
        "draws": [random.random(), float(numpy.random.random())],
        "frozen": gc.get_freeze_count(),
    }


if __name__ == "__main__":
    how = sys.argv[1]
    atexit.register(lambda: print("ATEXIT ran"))
    print("REPORT " + json.dumps(report()))
    if how == "exit3":
        sys.exit(3)
    if how == "error":
        raise ValueError("boom")
    if how == "interrupt":
        raise KeyboardInterrupt
    if how == "kill":
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
