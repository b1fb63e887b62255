"""Throughput, MFU and memory, and the metrics.jsonl writer.

MFU = flops_per_token × tokens/s per GPU / peak, where flops_per_token = 6·N + 12·L·H·Dh·T
(N = parameters a token uses, tied lm_head counted once: for a mixture of experts the routed
experts count num_experts_per_tok / num_experts of their size, routers and shared experts fully
(model.param_count); the attention term counts QKᵀ and AV forward and backward without the
causal discount), and peak is the dense bf16 peak of the detected GPU. CPU runs report no MFU.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import torch

from ..core import evalsamples, numbers
from ..core.runfolder import RunFolder
from ..data import samplestats
from .trackers import Trackers

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
    """Tokens/s and MFU over the window since the last row; one host sync per logged row only.

    `elapsed_s` is training time along the run's trajectory: the `elapsed_s` the resumed
    checkpoint recorded plus the time since this attempt began training. Like `tokens_seen`, it
    is a property of the step, so an interrupted run and an uninterrupted one plot alike; the
    time lost in the queue, at start-up and on repeated steps is not in it (`time` has the clock)."""

    def __init__(self, flops_per_token: float, device: torch.device, world_size: int, elapsed_before: float = 0.0):
        self.fpt, self.device, self.world = flops_per_token, device, world_size
        self.peak = peak_flops(device)
        self.t0, self.tokens, self.start = time.perf_counter(), 0, time.perf_counter()
        self.elapsed_before = elapsed_before

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.start

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
            "elapsed_s": self.elapsed(),
        }
        if self.device.type == "cuda":
            row["mem_peak_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        else:
            row["mem_peak_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        self.t0, self.tokens = now, 0
        return row


def format_row(row: dict, total_steps: int) -> str:
    """A rank-0 log line; it starts `step N/M loss L` whatever else the row holds (scripts and the
    notebook tests read that prefix)."""
    mfu = f" mfu {100 * row['mfu']:.1f}%" if row.get("mfu") is not None else ""
    epoch = f" epoch {row['epoch']:.2f}" if "epoch" in row else ""
    evaluated = f" eval_loss {row['eval_loss']:.4f}" if "eval_loss" in row else ""
    if "eval_ppl" in row:
        evaluated += f" eval_ppl {numbers.perplexity(row['eval_ppl'])}"
    if "reward_accuracy" in row:  # preference training (worker/preference.py)
        evaluated += f" reward_accuracy {row['reward_accuracy']:.2f} reward_margin {row['reward_margin']:.4f}"
    if "kl" in row:  # kto (worker/kto.py)
        evaluated += f" reward_margin {row.get('reward_margin', float('nan')):.4f} kl {row['kl']:.4f}"
    if "eval_reward_accuracy" in row:
        evaluated += f" eval_reward_accuracy {row['eval_reward_accuracy']:.2f}"
    return (
        f"step {row['step']}/{total_steps} loss {row['loss']:.4f}{epoch}{evaluated} lr {row['lr']:.2e} "
        f"grad_norm {row['grad_norm']:.3f} tokens/s {row['tokens_per_s']:,.0f}{mfu} mem {row['mem_peak_gb']:.2f} GB"
    )


class MetricsWriter:
    """Rank 0's metrics sink: one JSON object per logged step appended to metrics.jsonl, with the
    attempt that wrote it, and the same row to the configured experiment trackers."""

    def __init__(self, path: Path, attempt: int = 0, trackers: Trackers | None = None):
        self.path, self.attempt, self.trackers = path, attempt, trackers

    def begin(self, step: int) -> None:
        """Training starts at `step` (0, or the checkpoint it resumed from)."""
        if self.trackers is not None:
            self.trackers.begin(step)

    def write(self, row: dict) -> None:
        row = {**row, "attempt": self.attempt}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.trackers is not None:
            self.trackers.log(row)

    def samples(self, samples: list[evalsamples.EvalSample]) -> None:
        """An evaluation's generated samples ([eval] samples): `samples/step-N.jsonl` in the run
        folder that holds metrics.jsonl, and the trackers."""
        if not samples:
            return
        evalsamples.write(RunFolder(self.path.parent).samples_dir, samples[0].step, samples)
        if self.trackers is not None:
            self.trackers.samples(samples)

    def sample_sets(self, metas: dict[str, dict], sources: dict[str, list[dict]], steps: int) -> None:
        """The statistics of the sample sets (role -> index meta; a mixture's per source) and the
        steps the run trains into the run folder's data.json (data/samplestats.py)."""
        samplestats.write(RunFolder(self.path.parent).data_file, metas, sources, steps)
