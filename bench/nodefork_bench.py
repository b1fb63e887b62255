"""CPU only, on the devcluster (`bash slurm/devcluster.sh up`, SLURM_CONF exported): what the
training step of a Slurm job with two tasks on one node costs when the node's first task forks
the second task's rank (worker/nodefork.py) against both tasks starting cold
(CLUSTERFSDP_COLD_START=1), both sides in one run, alternated job by job so that a load spike on
this shared machine hits both alike.

    python bench/nodefork_bench.py [--rounds 3] [--steps 20]

Each job is jobs/tiny-cpu.toml (llama-tiny, 1 node x 2 tasks, fp32) for `--steps` steps, submitted
with `clusterfsdp submit --executor slurm --follow`; its cost is sacct's TotalCPU of the job's
step 0 (the srun step of the ranks: both tasks, and the forked rank, a child of the first task).
Prints each side's median and the ratio.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT

SIDES = {"every task cold": {"CLUSTERFSDP_COLD_START": "1"}, "second task forked": {}}


def total_cpu_s(job_id: str) -> float:
    """sacct's TotalCPU of step 0, in seconds ([DD-[HH:]]MM:SS.sss)."""
    out = subprocess.run(["sacct", "-n", "-P", "-j", f"{job_id}.0", "-o", "TotalCPU"], capture_output=True,
                         text=True, check=True).stdout.split()[0]  # fmt: skip
    days, _, rest = out.rpartition("-")
    parts = [float(x) for x in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    return (int(days or 0) * 24 + parts[0]) * 3600 + parts[1] * 60 + parts[2]


def one_job(job: Path, steps: int, extra: dict[str, str]) -> float:
    env = {k: v for k, v in os.environ.items() if k != "CLUSTERFSDP_COLD_START"} | extra
    argv = [sys.executable, "-m", "clusterfsdp.cli", "submit", str(job), "--executor", "slurm",
            "--set", f"train.steps={steps}", "--follow"]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    job_ids = re.findall(r"==> (\d+)\.0 ", r.stdout)
    if r.returncode != 0 or not job_ids:
        raise SystemExit(f"the job failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")
    return total_cpu_s(job_ids[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        text = (ROOT / "jobs" / "tiny-cpu.toml").read_text()
        text = text.replace('run_root = "../runs"', f'run_root = "{tmp}/runs"')
        text = text.replace('"data/corpus.txt"', f'"{ROOT / "jobs" / "data" / "corpus.txt"}"')
        job = Path(tmp) / "tiny.toml"
        job.write_text(text)
        cpu: dict[str, list[float]] = {name: [] for name in SIDES}
        for _ in range(args.rounds):
            for name, extra in SIDES.items():
                cpu[name].append(one_job(job, args.steps, extra))
    medians = {name: statistics.median(v) for name, v in cpu.items()}
    for name, v in cpu.items():
        print(f"{name:20s} median {medians[name]:5.1f} s CPU for the step  (jobs: {', '.join(f'{x:.1f}' for x in v)})")
    cold, forked = medians.values()
    print(f"forked / cold: {forked / cold:.2f}")


if __name__ == "__main__":
    main()
