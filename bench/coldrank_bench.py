"""CPU only: what a cold-started rank (every Slurm rank: an srun task is a fresh interpreter) spends,
with its imports done under the garbage collector as before against `warmstart.import_frozen`
(collector off during the imports, then one collection and `gc.freeze`), both sides in one run,
interleaved round by round so that a load spike on this shared machine hits both alike.

    python bench/coldrank_bench.py [--repeat 5] [--steps 2]

Two measurements per side and round, each in fresh processes, CPU seconds (user + system, the
process and everything it reaped):

- imports: `python -c` importing what a rank imports first (`worker.main.RANK_MODULES` and the
  llama family), then exiting (the exit-time collection is part of what a rank pays);
- a rank: `python -m clusterfsdp.worker RUN_DIR` alone (world 1, gloo), llama-tiny on the shipped
  corpus for `--steps` steps with its final checkpoint, from start to exit.

The "collector on" side is the same code with `warmstart.frozen_imports` replaced by a context
that does nothing (the imports as they were before it existed). Prints the medians and the ratio.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, tiny_run_folder

SIDES = ("collector on", "frozen")
_UNFREEZE = (
    "import contextlib; from clusterfsdp.worker import warmstart; warmstart.frozen_imports = contextlib.nullcontext; "
)
_IMPORTS = (
    "from clusterfsdp.worker import main, warmstart; "
    "warmstart.import_frozen(None, None, (*main.RANK_MODULES, 'transformers.models.llama.modeling_llama'))"
)
_RANK = "import runpy, sys; sys.argv[1:] = [sys.argv[1]]; runpy.run_module('clusterfsdp.worker', run_name='__main__')"


def _cpu(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{argv[:3]}...: exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def _rank_env(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    env.pop("CLUSTERFSDP_LAUNCHER", None)
    env |= {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    env |= {"MASTER_PORT": str(port), "CLUSTERFSDP_JOB_ID": f"b{port}", "OMP_NUM_THREADS": "1"}
    return env


def main() -> None:
    from clusterfsdp.worker import distenv

    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args()
    cpu: dict[str, dict[str, list[float]]] = {side: {"imports": [], "a rank": []} for side in SIDES}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        n = 0
        for round_ in range(args.repeat):
            for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
                head = _UNFREEZE if side == "collector on" else ""
                env = _rank_env(distenv.free_master_port())
                cpu[side]["imports"].append(_cpu([sys.executable, "-c", head + _IMPORTS], env))
                n += 1
                run = tiny_run_folder(tmp, f"coldrank{n}", args.steps)
                cpu[side]["a rank"].append(_cpu([sys.executable, "-c", head + _RANK, str(run)], env))
                print(f"round {round_ + 1} {side}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in cpu[side].items()))
    load = os.getloadavg()[0]
    print(f"\n{os.cpu_count()} CPUs, load {load:.1f}; median of {args.repeat} (CPU s, user + system)")
    print(f"{'':<10} {SIDES[0]:>13} {SIDES[1]:>8} {'ratio':>7}")
    for key in cpu[SIDES[0]]:
        on, frozen = (statistics.median(cpu[side][key]) for side in SIDES)
        print(f"{key:<10} {on:>13.2f} {frozen:>8.2f} {on / frozen:>7.2f}")


if __name__ == "__main__":
    main()
