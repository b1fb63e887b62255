"""The ranks of a preference run's reference job (control/refjob.py queues it on Slurm).

Each rank sets up as a training rank does (worker/attempt.py and rank.py: the run's job.toml and [env], the
process group on the job's nodes and GPUs), opens the prepared pairs, builds the frozen
reference sharded like the policy (preference.build_reference: no optimizer), computes the
log-probs of every train and eval pair and rank 0 writes the tables where the training attempt
reads them (<checkpoints>/reference/, preference.compute_tables). The training job, queued with
`--dependency=afterok` on this one, then holds only the policy.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..core import health, runfolder
from . import distenv
from .attempt import RankAttempt, load_spec, sized_spec


def run(run_dir: str) -> str:
    """Compute and keep the reference tables of the run in `run_dir`; 'reference' when done."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # as the training ranks: submit resolved every hub id
    t0 = time.perf_counter()
    attempt = RankAttempt(runfolder.RunFolder(Path(run_dir)), distenv.from_environ())
    spec = load_spec(attempt)  # [env] applied: before torch and transformers are imported, as in main.run
    # Here, not at the top: huggingface_hub (through transformers) reads HF_HUB_OFFLINE and the
    # job's [env] (HF_HOME, ...) when it is imported.
    import torch.distributed as dist

    from ..data.rankdata import open_for_training
    from . import preference, rank

    sized = sized_spec(spec, attempt.env)
    watch = health.WatchdogSettings.of(spec.train.watchdog)
    device, backend = rank.init_process_group(attempt, health.collective_timeout_s(watch, health.Phase.START_UP, 0))
    env = attempt.env

    def log(msg: str) -> None:
        if env.rank == 0:
            print(f"[reference] {msg}", flush=True)

    log(f"{env.world_size} ranks on {env.num_nodes} node(s), backend {backend}, job {env.job_id}")
    try:
        data = open_for_training(sized, env.rank, log)
        sets = {role: s for role, s in (("train", data.train), ("eval", data.eval)) if s is not None}
        checkpoints = attempt.run.checkpoints_dir(spec)
        preference.compute_tables(sized, sets, log, device, env.rank, env.world_size, checkpoints,
                                  kept=attempt.run.model_dir, max_id=data.max_id)  # fmt: skip
        log(f"reference pass done in {time.perf_counter() - t0:.1f} s")
    finally:
        dist.destroy_process_group()
    return "reference"
