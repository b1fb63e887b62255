"""A run's metrics as a pandas DataFrame (the `frames` extra: pip install 'clusterfsdp[frames]').

pandas is imported here only, when a frame is asked for; the control plane and the CLI never
import it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .control.run import Run
from .core.runfolder import RunFolder

if TYPE_CHECKING:
    # pandas (optional) only when a frame is asked for
    import pandas


def metrics_frame(run: Run | RunFolder | str | os.PathLike[str], *, latest: bool = True) -> pandas.DataFrame:
    """metrics.jsonl as a DataFrame indexed by step. `latest` (default): only the trajectory that
    training went on with, so the steps that a resume repeated (after a requeue, or `resume
    --step`) appear once, from the attempt that continued (`RunFolder.metrics(latest=True)`);
    False: every row as written, with its `attempt`. `time` becomes a timezone-aware timestamp."""
    try:
        # pandas (optional) only when a frame is asked for
        import pandas
    except ImportError:
        raise ImportError("metrics_frame needs pandas: pip install 'clusterfsdp[frames]'") from None
    if isinstance(run, Run):
        folder = run.folder
    elif isinstance(run, RunFolder):
        folder = run
    else:
        folder = Run.find(os.fspath(run)).folder
    frame = pandas.DataFrame(folder.metrics(latest=latest))
    if frame.empty:
        return frame
    if "time" in frame:
        frame["time"] = pandas.to_datetime(frame["time"], unit="s", utc=True)
    return frame.set_index("step")
