"""CPU only: what the experiment trackers cost rank 0, measured through the real sink
(`worker.metrics.MetricsWriter` with `worker.trackers.Trackers`): the time to open each tracker
(imports included, each in a fresh process) and the time per logged row, against metrics.jsonl
alone, side by side in one run. W&B offline, MLflow on the run folder's file store.

    .venv/bin/python bench/trackers_bench.py [--rows 500]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import json, sys, time
from clusterfsdp.core import runfolder, spec as S
from clusterfsdp.core.records import Executor
from clusterfsdp.worker.metrics import MetricsWriter
from clusterfsdp.worker.trackers import Trackers
trackers, rows, root = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
spec = S.loads(f'[job]\\nrun_root = "{root}"\\n[log]\\ntrackers = {json.dumps(trackers)}\\n')
run = runfolder.create_run(spec, Executor.LOCAL)
t1 = time.perf_counter()
sink = MetricsWriter(run.metrics_file, 0, Trackers.open(run, spec, 0, print) if trackers else None)
sink.begin(0)
t2 = time.perf_counter()
row = dict(loss=2.5, lr=3e-4, grad_norm=1.0, tokens_per_s=1e5, tokens_per_s_per_gpu=1e4, mfu=0.4,
           time=0.0, elapsed_s=1.0, mem_peak_gb=40.0, tokens_seen=10**9)
for step in range(1, rows + 1):
    sink.write({**row, "step": step})
t3 = time.perf_counter()
if sink.trackers is not None:
    sink.trackers.finish("completed")
t4 = time.perf_counter()
print("RESULT " + json.dumps({"open_s": t2 - t1, "per_row_ms": 1e3 * (t3 - t2) / rows, "finish_s": t4 - t3}))
"""


def measure(trackers: list[str], rows: int) -> dict:
    with tempfile.TemporaryDirectory() as root:
        env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
        env.pop("MLFLOW_TRACKING_URI", None)
        out = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(trackers), str(rows), root],
            capture_output=True, text=True, env=env, check=True, timeout=600,
        ).stdout  # fmt: skip
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=500)
    args = p.parse_args()
    base = measure([], args.rows)
    print(f"rows {args.rows}; metrics.jsonl alone: {base['per_row_ms']:.3f} ms/row")
    print(f"{'trackers':<28} {'open s':>7} {'ms/row':>7} {'x jsonl':>8} {'finish s':>8}")
    for trackers in (["tensorboard"], ["wandb"], ["mlflow"], ["tensorboard", "wandb", "mlflow"]):
        r = measure(trackers, args.rows)
        ratio = r["per_row_ms"] / base["per_row_ms"]
        print(
            f"{'+'.join(trackers):<28} {r['open_s']:>7.2f} {r['per_row_ms']:>7.3f} {ratio:>8.1f} {r['finish_s']:>8.2f}"
        )
    print(f"machine: {os.cpu_count()} CPUs, {Path('/proc/loadavg').read_text().split()[0]} load; {time.ctime()}")


if __name__ == "__main__":
    main()
