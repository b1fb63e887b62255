"""TensorBoard (`[log] trackers = ["tensorboard"]`): one log dir, `<run folder>/tensorboard/`
(a sweep's points: under the sweep folder, TensorBoard's parent folder). Each attempt opens a
new event file there with `purge_step` = the step it resumed from + 1, so TensorBoard drops the
points that the earlier attempt logged past that checkpoint and the curves continue without a
fold."""

from __future__ import annotations

from typing import Any

from ..core import spec as specmod
from ..core.evalsamples import EvalSample
from ..core.records import RankOutcome
from ..core.runfolder import RunFolder
from .trackerbase import INSTALL_HINT, TrackerError, hyperparameters, samples_markdown


class TensorBoard:
    name = "tensorboard"

    def __init__(self, run: RunFolder, spec: specmod.JobSpec, attempt: int):
        """(`attempt` is not used: an attempt's event file is named by its time and host.)"""
        try:
            # optional ([trackers] extra): only when [log] trackers names it
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise TrackerError(
                f"log.trackers: 'tensorboard' needs the tensorboard package ({e}); {INSTALL_HINT}"
            ) from None
        self._writer_class, self.run, self.spec = SummaryWriter, run, spec
        self.writer: Any = None

    def begin(self, step: int) -> None:
        from torch.utils.tensorboard.summary import hparams  # (optional, as above)

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
