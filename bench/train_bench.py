"""Throughput of the real worker code path on one GPU (issue 4).

Makes a run folder with a job spec (preset llama-1b, synthetic tokens, seq 2048, FSDP2 with
bf16 mixed precision, compile, ...) and calls `clusterfsdp.worker.run(run_dir)` in this
process, exactly as a Slurm task would (with no launcher variables it is a 1-rank process
group). Then reads the run's metrics.jsonl, skips the warm-up / compile steps and prints one
`RESULT {...}` line: tokens/s, MFU, peak memory, loss, and the checkpoint facts the worker
logged (async save: seconds the loop was blocked; the final synchronous save's duration).

    python3 bench/train_bench.py --bs 8                       # default config
    python3 bench/train_bench.py --bs 16 --reshard false      # a tuning variant
    python3 bench/train_bench.py --bs 16 --ckpt-every 30 --async-ckpt --steps 40
    python3 bench/train_bench.py --preset llama-tiny --seq 128 --cpu   # smoke test without a GPU
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_job, result, versions

from clusterfsdp.core.records import EventKind


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bs", type=int, default=8, help="micro-batch size")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--preset", default="llama-1b")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--skip", type=int, default=10, help="steps left out of the averages (compile, warm-up)")
    p.add_argument("--compile", choices=["true", "false"], default="true")
    p.add_argument("--reshard", choices=["true", "false"], default="true", help="fsdp.reshard_after_forward")
    p.add_argument("--ac", action="store_true", help="activation checkpointing")
    p.add_argument(
        "--loss",
        choices=["fused", "logits"],
        default="fused",
        help="'logits': disable the fused lm_head+loss (A/B of clusterfsdp/loss.py)",
    )
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument("--async-ckpt", action="store_true")
    p.add_argument("--run-root", default=os.environ.get("BENCH_RUN_ROOT", "/tmp/cfsdp-bench"))
    p.add_argument("--keep", action="store_true", help="keep the run's checkpoints (deleted by default)")
    p.add_argument("--cpu", action="store_true", help="no GPU: gloo, fp32 (smoke test of this script)")
    p.add_argument("--tag", default="")
    p.add_argument("--set", action="append", default=[], help="extra section.key=value overrides")
    a = p.parse_args()

    from clusterfsdp.core import runfolder
    from clusterfsdp.core.records import Executor
    from clusterfsdp.worker import loss as lossmod
    from clusterfsdp.worker import main as worker

    if a.loss == "logits":
        lossmod.FUSED_ARCHITECTURES = set()
    spec = bench_job(
        name="bench",
        run_root=a.run_root,
        preset=a.preset,
        seq=a.seq,
        bs=a.bs,
        steps=a.steps,
        log_every=a.log_every,
        compile=a.compile == "true",
        reshard=a.reshard == "true",
        ac=a.ac,
        mixed_precision="fp32" if a.cpu else "bf16",
        ckpt_every=a.ckpt_every,
        ckpt_async=a.async_ckpt,
        gpus=0 if a.cpu else 1,
        overrides=a.set,
    )
    run = runfolder.create_run(spec, Executor.LOCAL)
    t0 = time.time()
    try:
        status = worker.run(str(run.path))
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    wall = time.time() - t0

    rows = run.metrics()
    events = {e.event: e for e in run.events()}
    log = "".join(f.read_text() for f in run.log_files())
    blocked = [
        (int(m.group(1)), float(m.group(2)))
        for m in re.finditer(r"checkpoint step (\d+): training blocked ([\d.]+) s", log)
    ]
    first_ckpt = min((s for s, _ in blocked), default=None)
    # windows after the warm-up and before the first in-loop checkpoint (its background write slows the next window)
    use = [r for r in rows if r["step"] > a.skip and (first_ckpt is None or r["step"] <= first_ckpt)]
    tokens_per_window = a.log_every * a.bs * a.seq
    secs = sum(tokens_per_window / r["tokens_per_s"] for r in use)
    tps = tokens_per_window * len(use) / secs if use else float("nan")
    mfu = tps * use[0]["mfu"] / use[0]["tokens_per_s"] if use and use[0].get("mfu") else None  # mfu ∝ tokens/s
    after = [r for r in rows if first_ckpt is not None and first_ckpt < r["step"] <= first_ckpt + a.log_every]
    last = rows[-1] if rows else {}
    # The worker saves synchronously after the last step: completed event time - last metrics row time.
    done = events.get(EventKind.COMPLETED)
    final_save_s = (done.time - last["time"]) if done and last else None
    ckpt_dir = run.checkpoints_dir(spec)
    ckpt_bytes = sum(f.stat().st_size for f in ckpt_dir.rglob("*") if f.is_file()) if ckpt_dir.exists() else 0
    result(
        "train",
        tag=a.tag,
        status=status,
        preset=a.preset,
        seq=a.seq,
        bs=a.bs,
        compile=a.compile,
        reshard_after_forward=a.reshard,
        ac=a.ac,
        loss=a.loss,
        loss_path="fused" if "loss: lm_head fused" in log else "logits" if "loss: the full logits" in log else None,
        steps=a.steps,
        measured_steps=len(use) * a.log_every,
        tokens_per_s=round(tps),
        step_s=round(a.bs * a.seq / tps, 4) if use else None,
        mfu_pct=round(100 * mfu, 1) if mfu else None,
        peak_mem_gib=round(max(r["mem_peak_gb"] for r in rows), 1) if rows else None,
        window_tps=[round(r["tokens_per_s"]) for r in rows],
        loss_first=rows[0]["loss"] if rows else None,
        loss_last=last.get("loss"),
        ckpt_blocked_s=blocked,
        tps_window_after_ckpt=[round(r["tokens_per_s"]) for r in after],
        final_sync_save_s=round(final_save_s, 2) if final_save_s is not None else None,
        ckpt_gb=round(ckpt_bytes / 1e9, 2),
        wall_s=round(wall, 1),
        run=str(run.path),
        **versions(),
    )
    if not a.keep:
        shutil.rmtree(ckpt_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
