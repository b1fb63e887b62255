"""CPU only: start-to-first-step time of a local run, ranks started cold against ranks forked from
the warm controller (issue 36 item 2, worker/warmstart.py), both sides in one run, interleaved
round by round so that a load spike on a shared machine hits both alike.

    python bench/warmstart_bench.py [--repeat 3] [--ranks 2]

Each round submits jobs/tiny-cpu.toml (the shipped corpus, llama-tiny, FSDP2 on gloo) with
`clusterfsdp submit --executor local --follow` for one step, once with CLUSTERFSDP_COLD_START=1
(every rank its own interpreter, as before) and once warm (the default). Measured from the moment
`submit` is started (wall clock): rank 0's `start` event (set-up begins: the spec loaded, the
process group next) and the first step's metrics row, plus the wall time until `--follow`
returned (the final checkpoint saved). Prints the median of each and the cold/warm ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT

SIDES = ("cold", "warm")


def _job(tmp: Path, ranks: int) -> Path:
    text = (ROOT / "jobs" / "tiny-cpu.toml").read_text()
    text = text.replace('run_root = "../runs"', f'run_root = "{tmp / "runs"}"')
    text = text.replace('"data/corpus.txt"', f'"{ROOT / "jobs" / "data" / "corpus.txt"}"')
    text = text.replace("tasks_per_node = 2", f"tasks_per_node = {ranks}")
    path = tmp / "tiny.toml"
    path.write_text(text)
    return path


def _one(job: Path, tmp: Path, side: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    env.pop("CLUSTERFSDP_COLD_START", None)
    if side == "cold":
        env["CLUSTERFSDP_COLD_START"] = "1"
    before = set((tmp / "runs").rglob("state.json")) if (tmp / "runs").is_dir() else set()
    sets = ["train.steps=1", "train.log_every=1", "train.warmup=0"]
    argv = [sys.executable, "-m", "clusterfsdp", "submit", str(job), "--executor", "local", "--follow"]
    t0 = time.time()
    r = subprocess.run([*argv, *(a for s in sets for a in ("--set", s))], capture_output=True, text=True, env=env)
    done = time.time() - t0
    if r.returncode != 0:
        raise SystemExit(f"{side}: exit {r.returncode}: {r.stderr[-1500:]}")
    (state,) = set((tmp / "runs").rglob("state.json")) - before
    run = state.parent
    start = next(e for e in map(json.loads, (run / "events.jsonl").read_text().splitlines()) if e["event"] == "start")
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    node = json.loads(next((run / "nodes").rglob("*.json")).read_text())
    if node["warm_start"] != (side == "warm"):
        raise SystemExit(f"{side}: the node record says warm_start={node['warm_start']}")
    return {"start": start["time"] - t0, "first step": first["time"] - t0, "submit --follow": done}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        job = _job(tmp, args.ranks)
        times: dict[str, dict[str, list[float]]] = {side: {} for side in SIDES}
        for round_ in range(args.repeat):
            for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
                for key, value in _one(job, tmp, side).items():
                    times[side].setdefault(key, []).append(value)
                print(f"round {round_ + 1} {side}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times[side].items()))
    load = os.getloadavg()[0]
    print(f"\n{args.ranks} ranks, {os.cpu_count()} CPUs, load {load:.1f}; median of {args.repeat} (s, from submit)")
    print(f"{'':<18} {'cold':>7} {'warm':>7} {'cold/warm':>10}")
    for key in times["cold"]:
        cold, warm = (statistics.median(times[side][key]) for side in SIDES)
        print(f"{key:<18} {cold:>7.1f} {warm:>7.1f} {cold / warm:>10.2f}")


if __name__ == "__main__":
    main()
