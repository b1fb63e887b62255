"""CPU only: what the control plane's start-up costs, side by side with a bare interpreter
(issue 25 item 3). Each command is run `--repeat` times, interleaved round by round (as hyperfine
would run them one after the other, but alternating, so a load spike on a shared machine hits
every command alike); bytecode is warmed by one untimed round. Prints the median and the minimum
wall time of each (bytecode written by the warm-up round even where
$PYTHONDONTWRITEBYTECODE is set), and its ratio to `python -c pass` (both from the same round set, so the
ratios are comparable within one run even when the machine is busy).

    python bench/startup_bench.py [--repeat 30] [--tree DIR]

`--tree DIR` measures another source tree, e.g. an older commit for before/after
(`common.python_for`); `python -c pass` is then run the same way (`python -S`).

The commands: `--help`, `validate` of a small job (no data to check: synthetic tokens),
`status` of a finished run folder, `runs` over a run root of 20 runs, `runs --quiet` (what shell
completion calls). The run folders are made once under a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, python_for


def _setup(tmp: Path) -> tuple[str, str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from tui_helpers import make_run

    root = tmp / "runs"
    for i in range(20):
        make_run(root, f"20260101-1200{i:02d}-aaaa", checkpoints=(), log_lines=1, ranks=1)
    job = tmp / "job.toml"
    job.write_text(
        f'[job]\nname = "bench"\nrun_root = "{root}"\n[data]\nsource = "synthetic"\n'
        '[slurm]\ntasks_per_node = 2\n[fsdp]\nmixed_precision = "fp32"\n'
    )
    return str(root), str(job)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--tree", type=Path, help="the source tree to measure (default: this one)")
    args = p.parse_args()
    py = python_for(args.tree)
    with tempfile.TemporaryDirectory() as tmp:
        root, job = _setup(Path(tmp))
        cli = [*py, "-m", "clusterfsdp"]
        commands = {
            "python -c pass": [*py, "-c", "pass"],
            "clusterfsdp --help": [*cli, "--help"],
            "clusterfsdp validate": [*cli, "validate", job],
            "clusterfsdp status RUN": [*cli, "status", "20260101-120000-aaaa", "--run-root", root],
            "clusterfsdp runs (20 runs)": [*cli, "runs", "--run-root", root],
            "clusterfsdp runs --quiet": [*cli, "runs", "--quiet", "--run-root", root],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        env = {**os.environ, "HOME": tmp, "CLUSTERFSDP_RUN_ROOT": root}  # HOME: no user config read
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as an installed package has it
        for round_ in range(args.repeat + 1):
            for name, argv in commands.items():
                t0 = time.perf_counter()
                r = subprocess.run(argv, capture_output=True, env=env, cwd=tmp)
                elapsed = time.perf_counter() - t0
                if r.returncode != 0:
                    raise SystemExit(f"{name}: exit {r.returncode}: {r.stderr.decode()[-500:]}")
                if round_:  # round 0 warms the bytecode cache
                    times[name].append(elapsed)
    base = statistics.median(times["python -c pass"])
    print(f"{'command':<28} {'median ms':>10} {'min ms':>8} {'x python -c pass':>17}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<28} {med * 1000:>10.1f} {min(ts) * 1000:>8.1f} {med / base:>17.2f}")


if __name__ == "__main__":
    main()
