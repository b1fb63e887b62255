"""MLflow (`[log] trackers = ["mlflow"]`): the run id (and experiment id) is kept in
trackers.json; each attempt reopens the run and appends to the metric histories. Tracking URI:
`[log] mlflow_tracking_uri`, else $MLFLOW_TRACKING_URI, else a file store in
`<run folder>/mlruns`. A sweep (docs/sweeps.md) is one MLflow run (`<sweep folder>/mlflow.json`)
whose children the points' runs are, in the sweep folder's `mlruns` when no tracking URI is set."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ..core import spec as specmod
from ..core.evalsamples import EvalSample
from ..core.fileio import atomic_write
from ..core.lock import held
from ..core.records import RankOutcome
from ..core.runfolder import RunFolder
from ..core.sweeplayout import SweepLayout, sweep_of
from .trackerbase import INSTALL_HINT, TrackerError, hyperparameters, samples_markdown


class MLflow:
    name = "mlflow"
    # preempted, stopped: KILLED until resumed
    _STATUS = {RankOutcome.COMPLETED: "FINISHED", RankOutcome.FAILED: "FAILED"}

    def __init__(self, run: RunFolder, spec: specmod.JobSpec, attempt: int):
        try:
            from mlflow.tracking import MlflowClient  # optional ([trackers] extra): only when [log] trackers names it
        except ImportError as e:
            raise TrackerError(
                f"log.trackers: 'mlflow' needs the mlflow(-skinny) package ({e}); {INSTALL_HINT}"
            ) from None
        sweep = sweep_of(run)
        uri = mlflow_uri(run, spec)
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
        from mlflow.entities import Param  # (optional, as above)

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's batch limit
            self.client.log_batch(run_id, params=items[i : i + 100])

    def begin(self, step: int) -> None:
        pass

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric  # (optional, as above)

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def samples(self, samples: list[EvalSample]) -> None:
        self.client.log_text(self.run_id, samples_markdown(samples), f"samples/step-{samples[0].step}.md")

    def finish(self, outcome: RankOutcome) -> None:
        self.client.set_terminated(self.run_id, self._STATUS.get(outcome, "KILLED"))


def _without_query(uri: str) -> str:
    return uri.split("?", 1)[0]


def mlflow_uri(run: RunFolder, spec: specmod.JobSpec) -> str:
    """`[log] mlflow_tracking_uri`, else $MLFLOW_TRACKING_URI, else the file store in the run's (or
    its sweep's) folder."""
    sweep = sweep_of(run)
    uri = spec.log.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri:  # MLflow 3 wants an opt-in for the file store; it is the one that needs no server
        uri = ((sweep.path if sweep else run.path) / "mlruns").as_uri()
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return uri
