"""LoRA against a full fine-tune of the same model (issue 22), CPU: per-rank peak RSS, checkpoint
size and step time, side by side in one run.

    python bench/lora_bench.py --work /tmp/lora-bench [--preset llama-small] [--steps 12] [--world 2]

The base is the preset's config with random weights, written by `save_pretrained` (no
downloads). Both runs train it through the real worker (`clusterfsdp.worker.main.run` on a run
folder, `world` local gloo ranks, FSDP2, fp32, synthetic tokens, the same seed, batch and
steps): once as a full fine-tune, once with `[peft] method = "lora"` (r 16, all-linear). Each
rank reports its peak RSS (ru_maxrss) when it exits; the final checkpoint's size is the sum of
its files; the step time is the mean wall time per step over the steps after the first two
(from metrics.jsonl's `elapsed_s`). Prints a RESULT line per run (JSON) and the LoRA / full
ratios of the three.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from common import ROOT

sys.path.insert(0, str(ROOT / "tests"))
from procs import launch, make_run, wait  # the tests' launcher of real worker ranks

MAKE = r"""
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
from clusterfsdp.control.presets import PRESETS
keys = dict(PRESETS[sys.argv[2]]); model_type = keys.pop("model_type")
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **keys)).save_pretrained(sys.argv[1])
"""

RANK = r"""
import resource, sys
from clusterfsdp.worker.main import run
run(sys.argv[1])
print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
"""


def job(base: Path, steps: int, world: int, lora: bool) -> str:
    peft = '[peft]\nmethod = "lora"\nr = 16\nalpha = 32\n' if lora else ""
    return f"""
[job]
name = "{"lora" if lora else "full"}"
seed = 1
[model]
name_or_path = "{base}"
[data]
seq_len = 256
[train]
steps = {steps}
micro_batch_size = 2
warmup = 2
log_every = 1
[slurm]
tasks_per_node = {world}
[fsdp]
sharding = "full"
mixed_precision = "fp32"
{peft}"""


def train(text: str, root: Path, world: int) -> dict:
    run = make_run(text, root)
    results = wait(launch(["-c", RANK, str(run.path)], world, job_id="bench"), timeout=3600)
    outs = [out for _, out in results]
    if any(code for code, _ in results):
        raise RuntimeError("\n".join(o[-3000:] for o in outs))
    rss = [int(re.search(r"MAXRSS_KB (\d+)", o).group(1)) / 1024 for o in outs]  # type: ignore[union-attr]
    rows = run.metrics()
    timed = [r for r in rows if r["step"] > 2]
    step_s = (timed[-1]["elapsed_s"] - rows[1]["elapsed_s"]) / len(timed)
    final = max(run.checkpoints_dir().glob("step-*"))
    size = sum(f.stat().st_size for f in final.rglob("*") if f.is_file())
    trainable = re.search(r"peft: LoRA r=\d+, ([\d.]+)M trainable params", outs[0])
    return {
        "rss_mb": rss,
        "checkpoint_mb": size / 2**20,
        "step_s": step_s,
        "trainable_m": float(trainable.group(1)) if trainable else None,
        "final_loss": rows[-1]["loss"],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--preset", default="llama-small")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--world", type=int, default=2)
    args = ap.parse_args()
    base = args.work / f"base-{args.preset}"
    if not (base / "config.json").is_file():
        subprocess.run([sys.executable, "-c", MAKE, str(base), args.preset], check=True)
    out = {}
    for kind in ("full", "lora"):
        out[kind] = train(job(base, args.steps, args.world, kind == "lora"), args.work / "runs", args.world)
        print("RESULT " + json.dumps({"kind": kind, "preset": args.preset, "world": args.world, **out[kind]}))
    full, lora = out["full"], out["lora"]
    ratios = {
        "rss": max(lora["rss_mb"]) / max(full["rss_mb"]),
        "checkpoint": lora["checkpoint_mb"] / full["checkpoint_mb"],
        "step_time": lora["step_s"] / full["step_s"],
    }
    print("RESULT " + json.dumps({"kind": "ratio lora/full", **ratios}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
