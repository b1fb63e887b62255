"""The process that runs on every rank: `python -m clusterfsdp.worker RUN_DIR`, or the
callable `run(RUN_DIR)` that submitit pickles. Reads the run's job.toml, sets up
torch.distributed from Slurm's (or the local executor's) environment, trains, and records
start / end / requeue events in the run folder.

torch is imported inside `run` (worker/rank.py, after the stop flags are installed and
HF_HUB_OFFLINE and the job's [env] are set), so importing this module costs nothing: the CLI names it for submitit,
and the notebook kernel imports it. Its torch-free half is `attempt.py`.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from ..core import runfolder
from ..core.records import RankOutcome
from . import distenv, nodefork, warmstart
from .attempt import ENV_LOG_ALL_RANKS, LOCAL_REQUEUE_EXIT, RankAttempt, Tee, load_spec, untee
from .stopflags import StopFlags

__all__ = ["ENV_LOG_ALL_RANKS", "LOCAL_REQUEUE_EXIT", "Tee", "run"]

RANK_MODULES = ("clusterfsdp.worker.rank",)  # torch, transformers, the Trainer: what a rank imports first


def run(run_dir: str) -> RankOutcome:
    """Train on this rank; returns the outcome (COMPLETED, STOPPED) or exits (a requeue, a
    restart of the local executor, restarts used up). Every exception is recorded as a `failed` event first."""
    flags = StopFlags()  # first: a signal during the imports below must not be lost
    # Compute nodes never download: submit resolved every hub id to a local snapshot folder
    # (set before huggingface_hub is imported; [env] may still override it).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    dist = distenv.from_environ()
    node = nodefork.Node.of(dist, os.environ)  # a Slurm node with several tasks: one imports, forks the others
    if node is not None and not node.first and (sibling := nodefork.Sibling.ask(node)) is not None:
        return sibling.result()  # (the rank records its own events; this task ends as it did)
    gathering = nodefork.Gathering.listen(node) if node is not None and node.first else None
    attempt = RankAttempt(runfolder.RunFolder(Path(run_dir)), dist)
    try:
        spec = load_spec(attempt)  # the job's [env] applied, then torch and transformers imported:
        # huggingface_hub and torch read some of it (HF_HOME, HF_HUB_OFFLINE, ...) at import, and a
        # warm-started rank's launcher imported them under the same environment (warmstart.py).
        # here, not at the top: after the flags, HF_HUB_OFFLINE and [env]; a cold rank's ~370,000
        # import objects with the collector off, then frozen (a forked rank has them already)
        warmstart.import_frozen(spec, run_dir, RANK_MODULES)
        if gathering is not None:  # the node's other tasks: their ranks forked now (a child runs `run` and exits)
            gathering.fork_ranks(lambda: run(run_dir))
        from .rank import train_rank

        return train_rank(attempt, flags, spec)
    except SystemExit:
        raise
    except BaseException as e:
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        attempt.failed(e)
        untee()
        raise
    finally:
        if attempt.beat is not None:
            attempt.beat.close()
        sys.stdout.flush()
