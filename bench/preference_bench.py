"""Per-row log-probs of preference pairs (issue 37): the fused lm_head (`loss.attach`, logits a
chunk at a time, recomputed in backward) against the whole fp32 logits, CPU, side by side in
one run.

    python bench/preference_bench.py [--vocab 65536] [--rows 8] [--seq 1024] [--repeats 3]

A llama-shaped model with a large vocabulary and a small body (2 layers, hidden 128: the
logits dominate, as with a 128k vocabulary at any size) takes `repeats` forward + backward
passes of `preference.sequence_logps` over `rows` rows (the chosen and the rejected answers of
rows/2 pairs) of `seq` tokens, half of each a prompt. Each variant runs in its own process and
reports its peak RSS (ru_maxrss) and the mean time of the passes after the first. The logits
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
fused, vocab, rows, seq, repeats = sys.argv[1] == "fused", *map(int, sys.argv[2:6])
torch.manual_seed(0)
config = LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=seq)
model = LlamaForCausalLM(config).float()
if fused:
    assert lossmod.attach(model, compile=False)
ids = torch.randint(0, vocab, (rows, seq + 1), generator=torch.Generator().manual_seed(1))
labels = ids[:, 1:].clone()
labels[:, : seq // 2] = lossmod.IGNORE_INDEX
batch = Batch(input_ids=ids[:, :-1], labels=labels)
times, first = [], None
for _ in range(repeats):
    t0 = time.perf_counter()
    logps, _ = preference.sequence_logps(model, batch)
    (logps * torch.linspace(-1, 1, rows)).sum().backward()
    model.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0)
    first = logps.detach() if first is None else first
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT", json.dumps({"variant": sys.argv[1], "peak_rss_mb": peak,
                            "pass_s": sum(times[1:]) / max(1, len(times) - 1), "logps": first.tolist()}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=65536)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    results = {}
    for variant in ("logits", "fused"):
        argv = [variant, str(args.vocab), str(args.rows), str(args.seq), str(args.repeats)]
        out = subprocess.run([sys.executable, "-c", CHILD, *argv], cwd=ROOT, capture_output=True, text=True)
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"{variant} failed:\n{out.stderr[-3000:]}")
        results[variant] = json.loads(line[len("RESULT ") :])
        print(line[:200])
    a, b = results["fused"], results["logits"]
    diff = max(abs(x - y) for x, y in zip(a["logps"], b["logps"], strict=True))
    print(f"fused/logits: peak RSS {a['peak_rss_mb'] / b['peak_rss_mb']:.2f} "
          f"({a['peak_rss_mb']:.0f} / {b['peak_rss_mb']:.0f} MB), pass time {a['pass_s'] / b['pass_s']:.2f} "
          f"({a['pass_s']:.2f} / {b['pass_s']:.2f} s); largest log-prob difference {diff:.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
