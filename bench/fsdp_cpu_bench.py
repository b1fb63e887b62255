"""CPU seconds per rank of the same job on FSDP1 and on FSDP2 (issue 40), CPU, side by side in one run.

    python bench/fsdp_cpu_bench.py --work /tmp/fsdp-cpu [--steps 40] [--nodes 2] [--tasks 1] [--repeat 1]

The job is jobs/tiny-cpu.toml's (llama-tiny, byte tokens, seq 128, micro-batch 8, fp32) on
`nodes` x `tasks` local gloo ranks with `fsdp.sharding = "hybrid"` (2 nodes x 1 task: the
two-node run of the issue, HYBRID_SHARD with one rank a node; on one machine, as the devcluster's
nodes are), trained through the real worker (`clusterfsdp.worker.main.run`) for `steps` steps,
with FSDP2 and FSDP1, each with two thread settings: `share` (no OMP_NUM_THREADS: the worker gives
each rank its share of the machine's CPUs, worker/threads.py) and `all` (OMP_NUM_THREADS = every
CPU, in every rank: torch's own default, what ranks ran with before threads.py). `repeat` rounds
of the four. Each rank reports its process CPU time (user + system, all its threads,
`getrusage(RUSAGE_SELF)`) when the training loop starts, when it ends (before the final save)
and when the rank exits, and the loop's wall time. Prints a RESULT line per run (JSON: CPU-s per
rank in the loop and in all, the loop's wall seconds) and, per thread setting, the medians and
the FSDP1/FSDP2 ratios of the loop's and the whole run's CPU per rank.

    python bench/fsdp_cpu_bench.py --work /tmp/fsdp-cpu --slurm   # the devcluster (flock it)

`--slurm`: the same four runs as Slurm jobs of 2 devcluster nodes x 1 task (`clusterfsdp.Run`,
SlurmExecutor, as the issue's runs were), each job's CPU from `sacct` (TotalCPU of all its steps:
the batch script's and the ranks' srun step) and its elapsed time; "all" sets
`[env] OMP_NUM_THREADS` to the node's CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path

from common import ROOT

sys.path.insert(0, str(ROOT / "tests"))
from procs import CORPUS, launch, make_run, wait  # the tests' launcher of real worker ranks

RANK = r"""
import json, resource, sys, time
from clusterfsdp.worker import train
from clusterfsdp.worker.main import run

def cpu(who=resource.RUSAGE_SELF):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime

marks = {}
loop = train.Trainer.run
def timed(self):
    marks["loop_start"], marks["loop_start_wall"] = cpu(), time.perf_counter()
    save = self._save
    def final_save(*args, **kwargs):  # the loop's end: the final save is not a step
        if kwargs.get("blocking"):
            marks.setdefault("loop_end", cpu())
            marks.setdefault("loop_end_wall", time.perf_counter())
        return save(*args, **kwargs)
    self._save = final_save
    return loop(self)
train.Trainer.run = timed
run(sys.argv[1])
marks["exit"], marks["children"] = cpu(), cpu(resource.RUSAGE_CHILDREN)
print("CPU_MARKS " + json.dumps(marks), flush=True)
"""


def job(version: int, steps: int, nodes: int, tasks: int) -> tuple[str, list[str]]:
    """jobs/tiny-cpu.toml's text and the overrides that make it this run (no checkpoint but the final one)."""
    overrides = [f"job.name='fsdp{version}-cpu'", f"fsdp.version={version}", "fsdp.sharding='hybrid'",
                 f"slurm.nodes={nodes}", f"slurm.tasks_per_node={tasks}", f"train.steps={steps}",
                 f"data.paths=['{CORPUS}']", "checkpoint.every_steps=0"]  # fmt: skip
    return (ROOT / "jobs" / "tiny-cpu.toml").read_text(), overrides


def measure(version: int, threads: str, args: argparse.Namespace, root: Path) -> dict:
    text, overrides = job(version, args.steps, args.nodes, args.tasks)
    run = make_run(text, root, overrides)
    every_cpu = str(len(os.sched_getaffinity(0)))  # "all": torch's default, set explicitly; "share": unset
    omp = {"OMP_NUM_THREADS": every_cpu if threads == "all" else None}
    results = wait(launch(["-c", RANK, str(run.path)], args.nodes * args.tasks, "bench", omp), timeout=3600)
    outs = [out for _, out in results]
    if any(code for code, _ in results):
        raise RuntimeError("\n".join(o[-3000:] for o in outs))
    marks = [json.loads(re.search(r"CPU_MARKS (.*)", o).group(1)) for o in outs]  # type: ignore[union-attr]
    return {
        "version": version,
        "threads": threads,
        "steps": args.steps,
        "loop_cpu_s": [round(m["loop_end"] - m["loop_start"], 2) for m in marks],
        "total_cpu_s": [round(m["exit"], 2) for m in marks],
        "children_cpu_s": [round(m["children"], 2) for m in marks],
        "loop_wall_s": [round(m["loop_end_wall"] - m["loop_start_wall"], 2) for m in marks],
        "final_loss": run.metrics()[-1]["loss"],
    }


def on_slurm(version: int, threads: str, args: argparse.Namespace) -> dict:
    """One run as a Slurm job of the devcluster; its CPU and elapsed time from sacct."""
    import subprocess

    from clusterfsdp.control.run import Run
    from clusterfsdp.core import spec as specmod

    omp = [f"env.OMP_NUM_THREADS='{len(os.sched_getaffinity(0))}'"] if threads == "all" else []
    text, overrides = job(version, args.steps, args.nodes, args.tasks)
    where = f"job.run_root={str(args.work / 'slurm-runs')!r}"
    spec = specmod.loads(text, [*overrides, where, "slurm.time=30", *omp])
    sub = Run.submit(spec, "slurm")
    sub.run.wait(poll_s=2.0)
    # the job's own line (the first) sums its steps; with -X (the allocation alone) it would be 0
    row = subprocess.run(["sacct", "-j", sub.job_id, "-n", "-P", "--format=TotalCPU,ElapsedRaw"],
                         capture_output=True, text=True, check=True).stdout.split()[0]  # fmt: skip
    total, elapsed = row.split("|")
    return {"version": version, "threads": threads, "steps": args.steps, "job": sub.job_id,
            "total_cpu_s": _seconds(total), "elapsed_s": int(elapsed)}  # fmt: skip


def _seconds(sacct_time: str) -> float:
    """sacct's [DD-][HH:]MM:SS[.mmm] in seconds."""
    days, _, clock = sacct_time.rpartition("-")
    parts = [float(x) for x in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    return round(int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2], 2)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--slurm", action="store_true", help="Slurm jobs of the devcluster, CPU from sacct")
    args = ap.parse_args()
    if args.slurm:
        cpu = {}
        for threads in ("share", "all"):
            for version in (2, 1):
                got = on_slurm(version, threads, args)
                cpu[(version, threads)] = got["total_cpu_s"]
                print("RESULT " + json.dumps(got), flush=True)
            ratio = round(cpu[(1, threads)] / cpu[(2, threads)], 2)
            print("RESULT " + json.dumps({"kind": f"ratio fsdp1/fsdp2 on Slurm, threads {threads}", "job_cpu": ratio}))
        return 0
    kinds = [(v, t) for t in ("share", "all") for v in (2, 1)]
    runs: dict[tuple[int, str], list[dict]] = {k: [] for k in kinds}
    for _ in range(args.repeat):
        for version, threads in kinds:
            got = measure(version, threads, args, args.work / "runs")
            runs[(version, threads)].append(got)
            print("RESULT " + json.dumps(got), flush=True)

    def per_rank(kind: tuple[int, str], key: str) -> float:
        return statistics.median(sum(r[key]) / len(r[key]) for r in runs[kind])

    for threads in ("share", "all"):
        loop = {v: per_rank((v, threads), "loop_cpu_s") for v in (2, 1)}
        total = {v: per_rank((v, threads), "total_cpu_s") for v in (2, 1)}
        wall = {v: per_rank((v, threads), "loop_wall_s") for v in (2, 1)}
        print("RESULT " + json.dumps({
            "kind": f"ratio fsdp1/fsdp2, threads {threads}",
            "loop_cpu_per_rank_s": {f"fsdp{v}": round(x, 2) for v, x in loop.items()},
            "total_cpu_per_rank_s": {f"fsdp{v}": round(x, 2) for v, x in total.items()},
            "loop_wall_s": {f"fsdp{v}": round(x, 2) for v, x in wall.items()},
            "loop_cpu": round(loop[1] / loop[2], 2),
            "total_cpu": round(total[1] / total[2], 2),
        }), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
