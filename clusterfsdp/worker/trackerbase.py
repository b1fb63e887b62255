"""What every experiment tracker shares (`[log] trackers`): the `Tracker` protocol a tracker
class meets, `TrackerError`, and the values they log (the job's hyperparameters, a metrics row's
numbers, eval samples as Markdown). One module per tracker (`tbtracker`, `wandbtracker`,
`mlflowtracker`) builds on this one; `trackers.TRACKERS` names them, and `trackers.Trackers`
is the sink rank 0 writes to.

Hyperparameters are the job spec, flattened (`train.lr`, `slurm.nodes`, ...), without [env]:
environment values are not hyperparameters and must not leave the cluster. Secrets (W&B's key,
MLflow's password) come from the environment, as for any [env] secret, never from a file.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..core import spec as specmod
from ..core.evalsamples import EvalSample
from ..core.records import RankOutcome

_SKIPPED = ("step", "time")  # the x axis and the wall clock
INSTALL_HINT = "install it where the workers run: pip install 'clusterfsdp[trackers]'"


class TrackerError(RuntimeError):
    """A configured tracker cannot start; one line naming it."""


class Tracker(Protocol):
    """One tracker of rank 0, made by its entry in `trackers.TRACKERS`: called with the run
    folder, the job spec and the attempt number, it starts (or reopens) the tracker's run, or
    raises TrackerError with one line saying why it cannot (its package is imported only then)."""

    name: str

    def begin(self, step: int) -> None:
        """Training starts (again) at `step`: what comes later replaces what was logged past it."""

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def samples(self, samples: list[EvalSample]) -> None:
        """What the model generated at an evaluation ([eval] samples), all of one step."""

    def finish(self, outcome: RankOutcome) -> None:
        """How the attempt ended on this rank (preempted: it comes back and logs on)."""


def hyperparameters(spec: specmod.JobSpec) -> dict[str, Any]:
    """The job spec as flat `section.key` values (numbers, booleans, strings), [env] left out."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        elif isinstance(value, (bool, int, float, str)):
            out[prefix] = value
        else:
            out[prefix] = str(value)

    walk("", {k: v for k, v in specmod.to_dict(spec, redact=True).items() if k != "env"})
    return out


def numeric(row: dict[str, Any]) -> dict[str, float]:
    """A metrics row's values for a tracker: numbers only (mfu is null on CPU), under `train/`."""
    return {
        f"train/{k}": float(v)
        for k, v in row.items()
        if k not in _SKIPPED and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def samples_markdown(samples: list[EvalSample]) -> str:
    """A Markdown table of prompts and completions (TensorBoard renders text as Markdown)."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", "<br>") or " "

    lines = ["| prompt | completion |", "| --- | --- |"]
    return "\n".join(lines + [f"| {cell(s.prompt)} | {cell(s.completion)} |" for s in samples])
