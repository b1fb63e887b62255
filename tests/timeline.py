"""Where the suite's time goes (issue 36), per xdist worker: a pytest plugin that appends one JSON
line per test (worker, group, start, end, load average, failed or not) to the file named by CFDC_TEST_TIMELINE,
and, run as a script on that file, a summary `.ci/test` prints after the suite.

`--durations` lists the slowest tests but not which worker ran them, nor how long a worker sat
idle at the end: the critical path of a `-n 4 --dist loadgroup` run (a Slurm chain or a big
module group) is visible only with the workers side by side. Recording is off unless the
variable is set, so a developer's `pytest tests/x.py` writes nothing.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

ENV = "CFDC_TEST_TIMELINE"
_failed: set[str] = set()  # node ids with a failed setup, call or teardown (this process's tests)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        _failed.add(report.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Setup, call and teardown of one test, timed together (a module fixture's launches land on
    the test that first asks for it, as they do in the worker's own time)."""
    start = time.time()
    yield
    path = os.environ.get(ENV)
    if not path:
        return
    group = item.get_closest_marker("xdist_group")
    row = {
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "test": item.nodeid,
        "group": group.args[0] if group and group.args else "",
        "start": round(start, 2),
        "end": round(time.time(), 2),
        "load": round(os.getloadavg()[0], 1),
        "failed": item.nodeid in _failed,
    }
    with open(path, "a") as out:  # one short append per test: whole lines, several workers at once
        out.write(json.dumps(row) + "\n")


def summary(rows: list[dict]) -> str:
    """Per worker: tests, busy time, when it finished (the suite ends with the last one), its
    biggest groups; then the load average over the run."""
    if not rows:
        return "timeline: no tests recorded"
    t0, t1 = min(r["start"] for r in rows), max(r["end"] for r in rows)
    lines = [f"timeline: {len(rows)} tests, {(t1 - t0) / 60:.1f} min from the first start to the last end"]
    by_worker: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_worker[r["worker"]].append(r)
    for worker, mine in sorted(by_worker.items()):
        busy = sum(r["end"] - r["start"] for r in mine)
        groups: dict[str, float] = defaultdict(float)
        for r in mine:
            groups[r["group"] or "(ungrouped)"] += r["end"] - r["start"]
        top = ", ".join(f"{g} {s / 60:.1f}" for g, s in sorted(groups.items(), key=lambda kv: -kv[1])[:4])
        done = (max(r["end"] for r in mine) - t0) / 60
        lines.append(f"  {worker}: {len(mine)} tests, busy {busy / 60:.1f} min, done at {done:.1f}; by group: {top}")
    for r in (r for r in rows if r.get("failed")):  # where and when, beside what the others ran
        when = f"{(r['start'] - t0) / 60:.1f}-{(r['end'] - t0) / 60:.1f} min"
        lines.append(f"  failed on {r['worker']} at {when}: {r['test']}")
    loads = sorted(r["load"] for r in rows)
    lines.append(f"  load average (1 min) at test ends: median {loads[len(loads) // 2]}, max {loads[-1]}")
    return "\n".join(lines)


if __name__ == "__main__":
    file = Path(sys.argv[1])
    text = file.read_text() if file.exists() else ""
    print(summary([json.loads(line) for line in text.splitlines() if line.strip()]))
