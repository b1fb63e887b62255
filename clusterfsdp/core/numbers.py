"""How numbers that can span many orders of magnitude are written for people: the job's log,
`status`, the TUI. Torch-free: the worker and the control plane share it."""

from __future__ import annotations

import math

PLAIN_BELOW = 1e6  # a perplexity above this is a model that predicts nothing: its digits mean nothing


def perplexity(value: float) -> str:
    """exp(eval_loss): two decimals while it reads as a number (1.00 .. 999,999.99), in
    scientific notation beyond (an untrained or diverged model: 8.59e+18, not 19 digits)."""
    if not math.isfinite(value):
        return str(value)
    return f"{value:.2f}" if value < PLAIN_BELOW else f"{value:.2e}"
