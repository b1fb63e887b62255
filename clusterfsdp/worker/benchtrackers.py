"""Benchmark scores to W&B and MLflow (issue 38): worker/bench.py, in the evaluation's own process,
which lands after training moved on, maybe while it still runs. TensorBoard's are written by
core/benchresults.py's reader side (a run of its own in tensorboard/benchmarks/)."""

from __future__ import annotations

import os
import time

from ..core import spec as specmod
from ..core.runfolder import RunFolder
from .mlflowtracker import mlflow_uri
from .trackerbase import TrackerError
from .wandbtracker import wandb_run_id


def log_benchmarks(run: RunFolder, spec: specmod.JobSpec, step: int, scores: dict[str, float]) -> None:
    """The scores of checkpoint `step` to W&B and MLflow as `[log] trackers` names them. MLflow:
    into the training's run (trackers.json), at the checkpoint's step; a run takes writers side by
    side. W&B: into a run of its own beside the training's, `<run id>-benchmarks` (id `<the
    training's id>-bench`, same project and group, x axis `train/step`): a W&B run takes one
    writer at a time, and the training's may be live."""
    if "mlflow" in spec.log.trackers:
        from mlflow.entities import Metric  # optional ([trackers] extra): only with mlflow in [log] trackers
        from mlflow.tracking import MlflowClient

        run_id = run.tracker_ids().mlflow_run_id
        if not run_id:
            raise TrackerError("mlflow: the training has not made its MLflow run (trackers.json) to log into")
        now = int(time.time() * 1000)
        MlflowClient(tracking_uri=mlflow_uri(run, spec)).log_batch(
            run_id, metrics=[Metric(k, v, now, step) for k, v in scores.items()]
        )
    if "wandb" in spec.log.trackers:
        import wandb  # optional ([trackers] extra): only with wandb in [log] trackers

        # started by rank 0 (or sbatch from it), this process inherited the training's W&B service
        # socket, which ends with the training: this process starts a service of its own
        os.environ.pop("WANDB_SERVICE", None)
        wb = wandb.init(
            project=spec.log.project or spec.job.name,
            name=f"{run.id}-benchmarks",
            group=spec.job.name,
            job_type="benchmarks",
            id=f"{wandb_run_id(run)}-bench",
            resume="allow",
            dir=str(run.path),
            settings=wandb.Settings(console="off"),
        )
        wb.define_metric("train/step")
        wb.define_metric("bench/*", step_metric="train/step")
        wb.log({**scores, "train/step": step})
        wb.finish()
