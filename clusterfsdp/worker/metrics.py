"""Throughput, MFU and memory, and the metrics.jsonl writer.

MFU = flops_per_token × tokens/s per GPU / peak, where flops_per_token = 6·N + 12·L·H·Dh·T
(N = parameters with a tied lm_head counted once; the attention term counts QKᵀ and AV
forward and backward without the causal discount), and peak is the dense bf16 peak of the
detected GPU. CPU runs report no MFU.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

# Dense bf16 peak FLOP/s by device-name fragment (first match wins).
PEAK_FLOPS = [
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989.5e12),
    ("H200", 989.5e12),
    ("GH200", 989.5e12),
    ("B200", 2.25e15),
    ("B300", 2.25e15),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("A10G", 125e12),
]


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS if k in name), None)


class Meter:
    """Tokens/s and MFU over the window since the last row; one host sync per logged row only."""

    def __init__(self, flops_per_token: float, device: torch.device, world_size: int):
        self.fpt, self.device, self.world = flops_per_token, device, world_size
        self.peak = peak_flops(device)
        self.t0, self.tokens, self.start = time.perf_counter(), 0, time.time()

    def tick(self, tokens: int) -> None:
        self.tokens += tokens

    def row(self, **values) -> dict:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        tps = self.tokens / max(now - self.t0, 1e-9)
        row = {
            **values,
            "tokens_per_s": tps,
            "tokens_per_s_per_gpu": tps / self.world,
            "mfu": (self.fpt * tps / self.world / self.peak) if self.peak else None,
            "time": time.time(),
            "elapsed_s": time.time() - self.start,
        }
        if self.device.type == "cuda":
            row["mem_peak_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        else:
            import resource

            row["mem_peak_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        self.t0, self.tokens = now, 0
        return row


def format_row(row: dict, total_steps: int) -> str:
    mfu = f" mfu {100 * row['mfu']:.1f}%" if row.get("mfu") is not None else ""
    evaluated = f" eval_loss {row['eval_loss']:.4f} eval_ppl {row['eval_ppl']:.2f}" if "eval_loss" in row else ""
    return (
        f"step {row['step']}/{total_steps} loss {row['loss']:.4f}{evaluated} lr {row['lr']:.2e} "
        f"grad_norm {row['grad_norm']:.3f} tokens/s {row['tokens_per_s']:,.0f}{mfu} mem {row['mem_peak_gb']:.2f} GB"
    )


class MetricsWriter:
    """Appends one JSON object per logged step to metrics.jsonl (rank 0 only)."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, row: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
