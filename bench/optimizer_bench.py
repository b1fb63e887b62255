"""CPU only: AdamW's step over FSDP2's DTensor parameters, torch's default loop (single-tensor:
its default for any DTensor parameter, `_default_to_fused_or_foreach`) against `foreach=True`
(worker/optimizer.py's choice off GPUs, torchtitan's), both sides in one process, alternated round
by round so that a load spike on this shared machine hits both alike.

    python bench/optimizer_bench.py [--rounds 4] [--steps 30] [--layers 2]

One gloo process group of one rank; llama-tiny's shape (hidden 64, 2 layers, vocab 260) unless
--layers says more; every decoder layer and the model wrapped by `fully_shard`. Each round builds
the model afresh (seed 0), runs 3 steps with gradients, then times `--steps` `optimizer.step()`
calls (`time.process_time`); prints the median CPU ms per step of each side, their ratio, and
whether the two loops left bitwise the same parameters after the same steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import common  # noqa: F401  (puts the checkout on sys.path)
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

SIDES = {"single-tensor (torch's default)": False, "foreach": True}


def build(layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=260, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=4)  # fmt: skip
    model = LlamaForCausalLM(cfg)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def one_round(foreach: bool, steps: int, layers: int) -> tuple[float, list[torch.Tensor]]:
    model = build(layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), foreach=foreach)
    x = torch.randint(0, 260, (2, 64), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        model(x, labels=x).loss.backward()
        opt.step()
    t0 = time.process_time()
    for _ in range(steps):
        opt.step()
    ms = (time.process_time() - t0) / steps * 1000
    return ms, [p.full_tensor().detach().clone() for p in model.parameters()]  # pyright: ignore[reportAttributeAccessIssue]  (DTensor)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29981")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.set_num_threads(1)
    times: dict[str, list[float]] = {name: [] for name in SIDES}
    params: dict[str, list[torch.Tensor]] = {}
    for _ in range(args.rounds):
        for name, foreach in SIDES.items():
            ms, params[name] = one_round(foreach, args.steps, args.layers)
            times[name].append(ms)
    medians = {name: statistics.median(v) for name, v in times.items()}
    for name, v in times.items():
        print(f"{name:32s} median {medians[name]:6.2f} ms CPU per step  (rounds: {', '.join(f'{x:.2f}' for x in v)})")
    single, foreach = medians.values()
    same = all(torch.equal(a, b) for a, b in zip(*params.values(), strict=True))
    print(f"foreach / single-tensor: {foreach / single:.2f}; parameters bitwise equal after the same steps: {same}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
