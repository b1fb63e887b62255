"""Per-row log-probs of preference pairs (issue 37): the fused lm_head (`loss.attach`, logits a
chunk at a time, recomputed in backward) against the whole fp32 logits, CPU, side by side in
one run.

    python bench/preference_bench.py [--vocab 65536] [--rows 8] [--seq 1024] [--repeats 3]
    python3 bench/preference_bench.py --device cuda --dtype bfloat16 --vocab 128256 --seq 2048 \
        --hidden 2048 --layers 16        # on a GPU: a llama-1b body, peak GPU memory

A llama-shaped model with a large vocabulary and a small body (by default 2 layers, hidden 128:
the logits dominate, as with a 128k vocabulary at any size) takes `repeats` forward + backward
passes of `preference.sequence_logps` over `rows` rows (the chosen and the rejected answers of
rows/2 pairs) of `seq` tokens, half of each a prompt. Each variant runs in its own process and
reports its peak RSS (ru_maxrss; on CUDA the peak allocated GPU memory instead) and the mean
time of the passes after the first. The logits
path holds rows x seq x vocab fp32 values, then their log_softmax and gradient; the fused one
holds one chunk of loss.LOGPS_CHUNK_ELEMENTS logits at a time (eight chunks at the defaults)
and forms each chunk's logits again in backward.
Prints a RESULT line per variant (JSON) and the fused/logits ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from common import ROOT

CHILD = r"""
import json, resource, sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
from clusterfsdp.data.samples import Batch
from clusterfsdp.worker import loss as lossmod, preference
fused, (vocab, rows, seq, repeats, hidden, layers) = sys.argv[1] == "fused", map(int, sys.argv[2:8])
device, dtype = torch.device(sys.argv[8]), getattr(torch, sys.argv[9])
cuda = device.type == "cuda"
torch.manual_seed(0)
config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                     num_attention_heads=max(4, hidden // 128), num_key_value_heads=max(4, hidden // 128),
                     max_position_embeddings=seq)
model = LlamaForCausalLM(config).to(device=device, dtype=dtype)
if fused:
    assert lossmod.attach(model, compile=False)
ids = torch.randint(0, vocab, (rows, seq + 1), generator=torch.Generator().manual_seed(1))
labels = ids[:, 1:].clone()
labels[:, : seq // 2] = lossmod.IGNORE_INDEX
batch = Batch(input_ids=ids[:, :-1].to(device), labels=labels.to(device))
times, first = [], None
for _ in range(repeats):
    t0 = time.perf_counter()
    logps, _ = preference.sequence_logps(model, batch)
    (logps * torch.linspace(-1, 1, rows, device=device)).sum().backward()
    model.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
    first = logps.detach().cpu() if first is None else first
if cuda:
    peak = torch.cuda.max_memory_allocated() / 2**20
else:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT", json.dumps({"variant": sys.argv[1], "device": str(device), "dtype": sys.argv[9], "peak_mb": peak,
                            "peak_of": "gpu" if cuda else "rss",
                            "pass_s": sum(times[1:]) / max(1, len(times) - 1), "logps": first.tolist()}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=65536)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (then the peak is GPU memory, not RSS)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    results = {}
    for variant in ("logits", "fused"):
        sizes = (args.vocab, args.rows, args.seq, args.repeats, args.hidden, args.layers)
        argv = [variant, *map(str, sizes), args.device, args.dtype]
        out = subprocess.run([sys.executable, "-c", CHILD, *argv], cwd=ROOT, capture_output=True, text=True)
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"{variant} failed:\n{out.stderr[-3000:]}")
        results[variant] = json.loads(line[len("RESULT ") :])
        print(line[:200])
    a, b = results["fused"], results["logits"]
    diff = max(abs(x - y) for x, y in zip(a["logps"], b["logps"], strict=True))
    print(f"fused/logits: peak {a['peak_of']} {a['peak_mb'] / b['peak_mb']:.2f} "
          f"({a['peak_mb']:.0f} / {b['peak_mb']:.0f} MB), pass time {a['pass_s'] / b['pass_s']:.2f} "
          f"({a['pass_s']:.2f} / {b['pass_s']:.2f} s); largest log-prob difference {diff:.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
