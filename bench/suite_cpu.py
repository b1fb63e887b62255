"""Where a test-suite run's CPU goes, by kind of Python process (issue 36).

    python bench/suite_cpu.py hook VENV LOGDIR     # every later Python of VENV logs itself
    bash .ci/test                                  # (or any run)
    python bench/suite_cpu.py report LOGDIR        # CPU by kind of process
    python bench/suite_cpu.py unhook VENV

`hook` writes a `.pth` file into the venv's site-packages (a `sitecustomize` would lose to
Debian's own in /usr/lib/python3.11): each Python process of that venv appends its pid, parent pid,
start time and command line to LOGDIR/start when it starts, and its own user + system CPU seconds
to LOGDIR/end at exit (atexit, so a process killed by a signal logs no end: the report counts
them apart). A rank forked by a warm launcher (worker/warmstart.py, tests/rankserver.py) runs no
new interpreter: it logs no start, and its end carries its launcher's pid, so it is reported as
"forked from" its launcher's kind. The devcluster's nodes see /tmp, so their srun tasks log too
(`-m submitit.core._submit`).

Process accounting (`apt-get install acct; accton FILE`) gives every process, Python or not, its
CPU too, without the command line: the two were read together for the figures in bench/README.md.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

HOOK = """import os, time, atexit
def _suite_cpu_log(folder={folder!r}):
    try:
        with open("/proc/self/cmdline", "rb") as f:
            cmd = f.read().replace(b"\\0", b" ").decode(errors="replace").replace("\\n", " ")[:400]
        pid = os.getpid()
        with open(os.path.join(folder, "start"), "a") as f:
            f.write(f"{{pid}}\\t{{os.getppid()}}\\t{{time.time():.2f}}\\t{{cmd}}\\n")
    except OSError:
        return
    def done():
        t = os.times()
        try:
            with open(os.path.join(folder, "end"), "a") as f:
                f.write(f"{{os.getpid()}}\\t{{pid}}\\t{{time.time():.2f}}\\t{{t.user + t.system:.2f}}\\n")
        except OSError:
            pass
    atexit.register(done)
_suite_cpu_log()
"""
NAME = "zz_suite_cpu"


def site_packages(venv: Path) -> Path:
    (found,) = venv.glob("lib/python3*/site-packages")
    return found


def hook(venv: Path, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    sp = site_packages(venv)
    (sp / f"{NAME}.py").write_text(HOOK.format(folder=str(folder.resolve())))
    (sp / f"{NAME}.pth").write_text(f"import {NAME}\n")


def unhook(venv: Path) -> None:
    sp = site_packages(venv)
    for suffix in (".py", ".pth"):
        (sp / f"{NAME}{suffix}").unlink(missing_ok=True)


def kind(cmd: str) -> str:
    """A process's kind: the CLI's subcommand, a worker module, a -c snippet's first line, ..."""
    cmd = re.sub(r"\S*/python3?(\.\d+)?\b", "python", cmd, count=1)
    if "rankserver.py" in cmd:
        return "tests' rank server"
    m = re.search(r"-m (\S+)(?: (\S+))?", cmd)
    if m and m.group(1) in ("clusterfsdp", "clusterfsdp.cli"):
        return f"clusterfsdp {m.group(2) or ''}".strip()
    if m:
        return f"-m {m.group(1)}"
    if " -c " in cmd:
        return "-c " + cmd.split(" -c ", 1)[1].strip()[:50]
    return re.sub(r"/tmp/\S+", "<tmp>", cmd)[:70]


def report(folder: Path, top: int) -> None:
    starts: dict[int, list[tuple[float, str]]] = collections.defaultdict(list)
    for line in (folder / "start").read_text(errors="replace").splitlines():
        parts = line.split("\t", 3)
        if len(parts) == 4 and parts[0].isdigit():
            starts[int(parts[0])].append((float(parts[2]), parts[3]))
    cpu: dict[str, list[float]] = collections.defaultdict(list)
    ended: set[tuple[int, float]] = set()
    for line in (folder / "end").read_text().splitlines():
        pid, launcher, t, seconds = line.split("\t")
        found = [s for s in starts.get(int(launcher), []) if s[0] <= float(t)]
        if not found:
            continue
        start = max(found)
        label = kind(start[1])
        if int(pid) != int(launcher):
            label = f"forked from: {label}"
        else:
            ended.add((int(pid), start[0]))
        cpu[label].append(float(seconds))
    total = sum(sum(v) for v in cpu.values())
    print(f"{total / 60:.1f} CPU-min in {sum(len(v) for v in cpu.values())} logged exits")
    print(f"{'CPU-min':>8} {'count':>6} {'s each':>7}  kind")
    for label, values in sorted(cpu.items(), key=lambda kv: -sum(kv[1]))[:top]:
        print(f"{sum(values) / 60:8.2f} {len(values):6d} {sum(values) / len(values):7.2f}  {label}")
    silent = collections.Counter(kind(c) for pid, runs in starts.items() for t, c in runs if (pid, t) not in ended)
    print("started, no end logged (a signal ended them, or still running):", dict(silent.most_common(8)))


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    h = sub.add_parser("hook")
    h.add_argument("venv", type=Path)
    h.add_argument("folder", type=Path)
    u = sub.add_parser("unhook")
    u.add_argument("venv", type=Path)
    r = sub.add_parser("report")
    r.add_argument("folder", type=Path)
    r.add_argument("--top", type=int, default=30)
    a = p.parse_args()
    if a.what == "hook":
        hook(a.venv, a.folder)
    elif a.what == "unhook":
        unhook(a.venv)
    else:
        report(a.folder, a.top)


if __name__ == "__main__":
    main()
