"""LoRA against a full fine-tune of the same model (issue 22), CPU: per-rank peak RSS and
parameter bytes, checkpoint size and step time, side by side in one run.

    python bench/lora_bench.py --work /tmp/lora-bench [--preset llama-small] [--steps 12] [--world 2]
    python bench/lora_bench.py --work /tmp/lora-bench --preset llama-1b --base-only   # a base for the GPU plan

The base is the preset's config with random weights, written by `save_pretrained` (no
downloads). Three runs train it through the real worker (`clusterfsdp.worker.main.run` on a run
folder, `world` local gloo ranks, FSDP2, fp32 compute, synthetic tokens, the same seed, batch and
steps): a full fine-tune, LoRA (`[peft] method = "lora"`, r 16, all-linear) on the fp32 base, and
LoRA with the frozen base kept in bf16 (`peft.base_dtype = "bfloat16"`, fp32 adapters). Each rank
reports its peak RSS (ru_maxrss) when it exits and the bytes of the parameter shards it holds
once the model is built (where a bf16 base shows exactly; the RSS of a small model is mostly the
torch runtime, activations and gathered compute copies); the final checkpoint's size is the sum
of its files; the step time is the mean wall time per step over the steps after the first two (from
metrics.jsonl's `elapsed_s`). Prints a RESULT line per run (JSON) and the ratios of the four
figures: each LoRA run against the full fine-tune, and the bf16 base against the fp32 one.
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
from clusterfsdp.core.presets import PRESETS
keys = dict(PRESETS[sys.argv[2]]); model_type = keys.pop("model_type")
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **keys)).save_pretrained(sys.argv[1])
"""

RANK = r"""
import resource, sys
from clusterfsdp.worker import train
from clusterfsdp.worker.main import run

built = train.build
def build(*args, **kwargs):  # the bytes of the parameter shards this rank holds, once built
    out = built(*args, **kwargs)
    local = [getattr(p, "_local_tensor", p) for p in out[0].parameters()]
    print("PARAM_BYTES", sum(t.numel() * t.element_size() for t in local), flush=True)
    return out
train.build = build
run(sys.argv[1])
print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
"""


LORA = '[peft]\nmethod = "lora"\nr = 16\nalpha = 32\n'
KINDS = {"full": "", "lora": LORA, "lora_bf16_base": LORA + 'base_dtype = "bfloat16"\n'}  # kind -> [peft]


def job(base: Path, steps: int, world: int, kind: str) -> str:
    return f"""
[job]
name = "{kind}"
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
{KINDS[kind]}"""


def _per_rank(outs: list[str], key: str) -> list[int]:
    return [int(re.search(rf"{key} (\d+)", o).group(1)) for o in outs]  # type: ignore[union-attr]


def train(text: str, root: Path, world: int) -> dict:
    run = make_run(text, root)
    results = wait(launch(["-c", RANK, str(run.path)], world, job_id="bench"), timeout=3600)
    outs = [out for _, out in results]
    if any(code for code, _ in results):
        raise RuntimeError("\n".join(o[-3000:] for o in outs))
    rss = [kb / 2**10 for kb in _per_rank(outs, "MAXRSS_KB")]
    params = [b / 2**20 for b in _per_rank(outs, "PARAM_BYTES")]
    rows = run.metrics()
    timed = [r for r in rows if r["step"] > 2]
    step_s = (timed[-1]["elapsed_s"] - rows[1]["elapsed_s"]) / len(timed)
    final = max(run.checkpoints_dir().glob("step-*"))
    size = sum(f.stat().st_size for f in final.rglob("*") if f.is_file())
    trainable = re.search(r"peft: LoRA r=\d+, ([\d.]+)M trainable params", outs[0])
    return {
        "rss_mb": rss,
        "params_mb": params,
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
    ap.add_argument(
        "--base-only", action="store_true", help="write WORK/base-PRESET and stop (the GPU plan `device_run.sh lora`)"
    )
    args = ap.parse_args()
    base = args.work / f"base-{args.preset}"
    if not (base / "config.json").is_file():
        subprocess.run([sys.executable, "-c", MAKE, str(base), args.preset], check=True)
    if args.base_only:
        return 0
    out = {}
    for kind in KINDS:
        out[kind] = train(job(base, args.steps, args.world, kind), args.work / "runs", args.world)
        print("RESULT " + json.dumps({"kind": kind, "preset": args.preset, "world": args.world, **out[kind]}))
    for over, under in (("lora", "full"), ("lora_bf16_base", "full"), ("lora_bf16_base", "lora")):
        a, b = out[over], out[under]
        ratios = {
            "rss": max(a["rss_mb"]) / max(b["rss_mb"]),
            "params": max(a["params_mb"]) / max(b["params_mb"]),
            "checkpoint": a["checkpoint_mb"] / b["checkpoint_mb"],
            "step_time": a["step_s"] / b["step_s"],
        }
        print("RESULT " + json.dumps({"kind": f"ratio {over}/{under}", **ratios}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
