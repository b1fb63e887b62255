"""Experiment trackers on rank 0: TensorBoard, Weights & Biases, MLflow (`[log] trackers`).

One tracker run per clusterfsdp run, whatever happens to it: every attempt (a Slurm requeue, a
local restart, `clusterfsdp resume` on another node count) logs into the same one.
- TensorBoard: one log dir, `<run folder>/tensorboard/`. Each attempt opens a new event file
  there with `purge_step` = the step it resumed from + 1, so TensorBoard drops the points that
  the earlier attempt logged past that checkpoint and the curves continue without a fold.
- W&B: files under `<run folder>/wandb/`; the run id is kept in trackers.json and every attempt
  resumes it (`resume="allow"`). Rows are logged with `train/step` as their x axis rather than
  W&B's own step, which must only grow: the steps a resume repeats are kept, not dropped.
- MLflow: the run id (and experiment id) is kept in trackers.json; each attempt reopens the run
  and appends to the metric histories. Tracking URI: `[log] mlflow_tracking_uri`, else
  $MLFLOW_TRACKING_URI, else a file store in `<run folder>/mlruns`.
- Sweeps (docs/sweeps.md): W&B groups the points by job.name (the sweep folder's name), in the
  job's project; TensorBoard's parent folder is the sweep folder; MLflow makes one run per sweep
  (`<sweep folder>/mlflow.json`) whose children the points' runs are, in the sweep folder's
  `mlruns` when no tracking URI is set.

Hyperparameters are the job spec, flattened (`train.lr`, `slurm.nodes`, ...), without [env]:
environment values are not hyperparameters and must not leave the cluster. Secrets (W&B's key,
MLflow's password) come from the environment, as for any [env] secret, never from a file.

Each package is imported only when its tracker is configured, on rank 0. A tracker that fails
while training is switched off with one line in the log: the training run is worth more than
its plots. One that cannot start fails the attempt before training, with the reason.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..core import spec as specmod
from ..core.evalsamples import EvalSample
from ..core.fileio import atomic_write
from ..core.lock import held
from ..core.outcomes import RankOutcome
from ..core.runfolder import RunFolder
from ..core.sweeplayout import SweepLayout, sweep_of

_SKIPPED = ("step", "time")  # the x axis and the wall clock
INSTALL_HINT = "install it where the workers run: pip install 'clusterfsdp[trackers]'"


class TrackerError(RuntimeError):
    """A configured tracker cannot start; one line naming it."""


class Tracker(Protocol):
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


class TensorBoard:
    name = "tensorboard"

    def __init__(self, run: RunFolder, spec: specmod.JobSpec):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise TrackerError(
                f"log.trackers: 'tensorboard' needs the tensorboard package ({e}); {INSTALL_HINT}"
            ) from None
        self._writer_class, self.run, self.spec = SummaryWriter, run, spec
        self.writer: Any = None

    def begin(self, step: int) -> None:
        from torch.utils.tensorboard.summary import hparams

        self.writer = self._writer_class(log_dir=str(self.run.tensorboard_dir), purge_step=step + 1)
        for summary in hparams(hyperparameters(self.spec), {"train/loss": 0.0}):
            self.writer.file_writer.add_summary(summary, step)
        self.writer.add_text("job.toml", "```toml\n" + specmod.dumps(self.spec, redact=True) + "\n```", step)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def samples(self, samples: list[EvalSample]) -> None:
        self.writer.add_text("eval/samples", samples_markdown(samples), samples[0].step)

    def finish(self, outcome: RankOutcome) -> None:
        if self.writer is not None:
            self.writer.close()


class WandB:
    name = "wandb"

    def __init__(self, run: RunFolder, spec: specmod.JobSpec, attempt: int):
        try:
            import wandb
        except ImportError as e:
            raise TrackerError(f"log.trackers: 'wandb' needs the wandb package ({e}); {INSTALL_HINT}") from None
        ids = run.tracker_ids()
        if not ids.wandb_run_id:
            ids.wandb_run_id = secrets.token_hex(4)  # W&B's own ids are 8 characters of [a-z0-9]
            run.write_tracker_ids(ids)
        try:
            self.wb = wandb.init(
                project=spec.log.project or spec.job.name,
                name=run.id,
                group=spec.job.name,
                id=ids.wandb_run_id,
                resume="allow",
                dir=str(run.path),
                config=hyperparameters(spec),
                settings=wandb.Settings(console="off"),  # the rank logs already hold the output
            )
        except Exception as e:
            raise TrackerError(f"log.trackers: wandb.init failed: {type(e).__name__}: {e}") from None
        self.wb.config.update({"clusterfsdp.attempt": attempt}, allow_val_change=True)
        self.wb.define_metric("train/step")
        self.wb.define_metric("train/*", step_metric="train/step")

    def begin(self, step: int) -> None:
        pass

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.wb.log({**metrics, "train/step": step})

    def samples(self, samples: list[EvalSample]) -> None:
        import wandb

        table = wandb.Table(columns=["step", "prompt", "completion"])
        for s in samples:
            table.add_data(s.step, s.prompt, s.completion)
        self.wb.log({"eval/samples": table, "train/step": samples[0].step})

    def finish(self, outcome: RankOutcome) -> None:
        self.wb.finish(exit_code=1 if outcome is RankOutcome.FAILED else 0)


class MLflow:
    name = "mlflow"
    # preempted, stopped: KILLED until resumed
    _STATUS = {RankOutcome.COMPLETED: "FINISHED", RankOutcome.FAILED: "FAILED"}

    def __init__(self, run: RunFolder, spec: specmod.JobSpec, attempt: int):
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise TrackerError(
                f"log.trackers: 'mlflow' needs the mlflow(-skinny) package ({e}); {INSTALL_HINT}"
            ) from None
        sweep = sweep_of(run)
        uri = spec.log.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
        if not uri:  # MLflow 3 wants an opt-in for the file store; it is the one that needs no server
            uri = ((sweep.path if sweep else run.path) / "mlruns").as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        ids = run.tracker_ids()
        try:
            if ids.mlflow_run_id:
                self.client.update_run(ids.mlflow_run_id, status="RUNNING")
            else:
                name = spec.log.project or spec.job.name
                found = self.client.get_experiment_by_name(name)
                ids.mlflow_experiment_id = found.experiment_id if found else self.client.create_experiment(name)
                tags = {"clusterfsdp.run_folder": str(run.path)}
                if sweep is not None:  # a point of a sweep: a child of the sweep's run
                    tags.update({"mlflow.parentRunId": self._parent(sweep, uri, ids.mlflow_experiment_id),
                                 "clusterfsdp.sweep": sweep.id})  # fmt: skip
                created = self.client.create_run(ids.mlflow_experiment_id, run_name=run.id, tags=tags)
                ids.mlflow_run_id = created.info.run_id
                run.write_tracker_ids(ids)
                self._log_params(ids.mlflow_run_id, hyperparameters(spec))
            self.client.set_tag(ids.mlflow_run_id, "clusterfsdp.attempt", str(attempt))
        except Exception as e:
            raise TrackerError(
                f"log.trackers: mlflow at {_without_query(uri)} failed: {type(e).__name__}: {e}"
            ) from None
        self.run_id = ids.mlflow_run_id

    def _parent(self, sweep: SweepLayout, uri: str, experiment_id: str) -> str:
        """The sweep's MLflow run, made by its first point (under a lock in the sweep folder: points
        start side by side) and kept in `<sweep folder>/mlflow.json` with its tracking URI."""
        record = sweep.path / "mlflow.json"
        with held(sweep.path / ".mlflow.lock", "mlflow parent run", timeout_s=60.0):
            try:
                known = json.loads(record.read_text())
                if known.get("uri") == _without_query(uri) and isinstance(known.get("run_id"), str):
                    return known["run_id"]
            except (OSError, ValueError, AttributeError):
                pass
            parent = self.client.create_run(
                experiment_id, run_name=sweep.id, tags={"clusterfsdp.sweep_folder": str(sweep.path)}
            )
            self.client.set_terminated(parent.info.run_id)  # it logs nothing; its children do
            atomic_write(record, json.dumps({"uri": _without_query(uri), "run_id": parent.info.run_id}) + "\n")
            return parent.info.run_id

    def _log_params(self, run_id: str, params: dict[str, Any]) -> None:
        """Parameters are immutable in MLflow: logged once, when the run is created."""
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's batch limit
            self.client.log_batch(run_id, params=items[i : i + 100])

    def begin(self, step: int) -> None:
        pass

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def samples(self, samples: list[EvalSample]) -> None:
        self.client.log_text(self.run_id, samples_markdown(samples), f"samples/step-{samples[0].step}.md")

    def finish(self, outcome: RankOutcome) -> None:
        self.client.set_terminated(self.run_id, self._STATUS.get(outcome, "KILLED"))


def samples_markdown(samples: list[EvalSample]) -> str:
    """A Markdown table of prompts and completions (TensorBoard renders text as Markdown)."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", "<br>") or " "

    lines = ["| prompt | completion |", "| --- | --- |"]
    return "\n".join(lines + [f"| {cell(s.prompt)} | {cell(s.completion)} |" for s in samples])


def _without_query(uri: str) -> str:
    return uri.split("?", 1)[0]


class Trackers:
    """The configured trackers as one sink; rank 0 only."""

    def __init__(self, trackers: list[Tracker], log: Callable[[str], None]):
        self.trackers, self.log_line = trackers, log

    @classmethod
    def open(cls, run: RunFolder, spec: specmod.JobSpec, attempt: int, log: Callable[[str], None]) -> Trackers:
        """Start every tracker of `[log] trackers` (TrackerError naming the first that cannot)."""
        opened: list[Tracker] = []
        for name in spec.log.trackers:
            if name == "tensorboard":
                opened.append(TensorBoard(run, spec))
            elif name == "wandb":
                opened.append(WandB(run, spec, attempt))
            else:
                opened.append(MLflow(run, spec, attempt))
        return cls(opened, log)

    def _each(self, what: str, call: Callable[[Tracker], None]) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as e:
                self.trackers.remove(tracker)
                self.log_line(f"tracker {tracker.name}: {what} failed, switched off for this attempt: {e}")

    def begin(self, step: int) -> None:
        self._each("start", lambda t: t.begin(step))

    def log(self, row: dict[str, Any]) -> None:
        values = numeric(row)
        self._each("logging", lambda t: t.log(values, row["step"]))

    def samples(self, samples: list[EvalSample]) -> None:
        self._each("samples", lambda t: t.samples(samples))

    def finish(self, outcome: RankOutcome) -> None:
        self._each("closing", lambda t: t.finish(outcome))
