"""Weights & Biases (`[log] trackers = ["wandb"]`): files under `<run folder>/wandb/`; the run
id is kept in trackers.json and every attempt resumes it (`resume="allow"`). Rows are logged
with `train/step` as their x axis rather than W&B's own step, which must only grow: the steps a
resume repeats are kept, not dropped. A sweep's points are grouped by job.name (the sweep
folder's name), in the job's project."""

from __future__ import annotations

import secrets

from ..core import spec as specmod
from ..core.evalsamples import EvalSample
from ..core.records import RankOutcome
from ..core.runfolder import RunFolder
from .trackerbase import INSTALL_HINT, TrackerError, hyperparameters


class WandB:
    name = "wandb"

    def __init__(self, run: RunFolder, spec: specmod.JobSpec, attempt: int):
        try:
            import wandb  # optional ([trackers] extra): only when [log] trackers names it
        except ImportError as e:
            raise TrackerError(f"log.trackers: 'wandb' needs the wandb package ({e}); {INSTALL_HINT}") from None
        try:
            self.wb = wandb.init(
                project=spec.log.project or spec.job.name,
                name=run.id,
                group=spec.job.name,
                id=wandb_run_id(run),
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
        import wandb  # (optional, as above)

        table = wandb.Table(columns=["step", "prompt", "completion"])
        for s in samples:
            table.add_data(s.step, s.prompt, s.completion)
        self.wb.log({"eval/samples": table, "train/step": samples[0].step})

    def finish(self, outcome: RankOutcome) -> None:
        self.wb.finish(exit_code=1 if outcome is RankOutcome.FAILED else 0)


def wandb_run_id(run: RunFolder) -> str:
    """The run's W&B run id, made and kept in trackers.json by the first attempt that asks."""
    ids = run.tracker_ids()
    if not ids.wandb_run_id:
        ids.wandb_run_id = secrets.token_hex(4)  # W&B's own ids are 8 characters of [a-z0-9]
        run.write_tracker_ids(ids)
    return ids.wandb_run_id
