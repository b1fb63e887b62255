"""The progress display of a notebook launch (an updating HTML table in the cell) and the metrics
file it follows."""

from __future__ import annotations

import html
import sys
import time
from typing import Any

from ..control.jsonltail import JsonlTail


def in_kernel() -> bool:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    ip = ipython.get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


class StepDisplay:
    """An in-place display (step / total, loss, tokens/s) updated from metrics.jsonl."""

    def __init__(self, title: str, total: int, enabled: bool):
        self.title, self.total, self.handle = title, total, None
        self.row: dict[str, Any] = {}
        self.eval_loss: float | None = None  # from the last row that has one (evaluations are sparser)
        self.state = "starting"
        self.t0 = time.time()
        if enabled:
            # IPython only inside a notebook
            from IPython.display import display

            self.handle = display(self._data(), raw=True, display_id=True)

    def _data(self) -> dict[str, str]:
        step = int(self.row.get("step", 0))
        loss = f"{self.row['loss']:.4f}" if "loss" in self.row else "-"
        evaluated = f" eval_loss {self.eval_loss:.4f}" if self.eval_loss is not None else ""
        tps = f"{self.row['tokens_per_s']:,.0f}" if "tokens_per_s" in self.row else "-"
        elapsed = time.time() - self.t0
        text = (
            f"{self.title}  step {step}/{self.total}  loss {loss}{evaluated}  tokens/s {tps}  "
            f"{elapsed:.0f} s  [{self.state}]"
        )
        bar = int(30 * step / max(self.total, 1))
        plain = f"[{'#' * bar}{'.' * (30 - bar)}] {text}"
        color = {"completed": "#2e7d32", "failed": "#c62828", "interrupted": "#ef6c00"}.get(self.state, "#1565c0")
        markup = (
            f"<div style='font-family:monospace'><progress value='{step}' max='{self.total}' "
            f"style='width:24em;vertical-align:middle'></progress> {html.escape(self.title)} &middot; "
            f"step <b>{step}</b>/{self.total} &middot; loss <b>{loss}</b>{evaluated} &middot; {tps} tokens/s "
            f"&middot; {elapsed:.0f} s &middot; <span style='color:{color}'>{html.escape(self.state)}</span></div>"
        )
        return {"text/plain": plain, "text/html": markup}

    def update(self, row: dict[str, Any] | None = None, state: str | None = None) -> None:
        if row:
            self.row = row
            if row.get("eval_loss") is not None:
                self.eval_loss = float(row["eval_loss"])
        if state:
            self.state = state
        if self.handle is not None:
            self.handle.update(self._data(), raw=True)


# The notebook reads metrics.jsonl through the shared JSONL tail (the TUI's charts do too);
# step.py knows it by this name.
MetricsTail = JsonlTail
