"""A stand-in rank for tests/test_rankserver.py: `python -m served_rank` prints one REPORT line (its
pid and parent, argv, /proc cmdline, module name, stdio buffering, RANK), then ends as its RANK
says: 0 exits 0, 1 exits 1, 2 says "waiting" and sleeps until it is signalled."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    rank = os.environ["RANK"]
    stdio = [
        (type(s.buffer).__name__, s.write_through, s.line_buffering, s.errors, s.encoding)
        for s in (sys.stdout, sys.stderr)
        if isinstance(s, io.TextIOWrapper)
    ]
    report = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]],
        "cmdline": Path("/proc/self/cmdline").read_bytes().rstrip(b"\0").decode().split("\0"),
        "path0": sys.path[0],
        "name": __name__,
        "stdio": stdio,
        "rank": rank,
    }
    print("REPORT " + json.dumps(report), flush=True)
    print(f"rank {rank} on stderr", file=sys.stderr, flush=True)
    if rank == "1":
        sys.exit(1)
    if rank == "2":
        print("waiting", flush=True)
        time.sleep(600)
