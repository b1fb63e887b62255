"""CPU only: what a rank forked by a warm launcher (the local executor's controller, the notebook's
supervisor, the tests' rank server: worker/warmstart.py) spends, with transformers' checkpoint
conversion table built once by the launcher (`warmstart.fill_caches`) against each rank building
it on first use, both sides in one run, interleaved round by round so that a load spike on this
shared machine hits both alike.

    python bench/forkedrank_bench.py [--repeat 5] [--steps 8] [--world 2]

Each side is one launcher process (`warmstart.Launcher`, preloading what a rank imports and the
llama family; the "built by each rank" side has `fill_caches` replaced by a function that does
nothing). Per round, each launcher forks one world of `--world` ranks of `python -m
clusterfsdp.worker RUN_DIR` (gloo, llama-tiny on the shipped corpus for `--steps` steps with its
final checkpoint) and reports the CPU seconds (user + system) its ranks used, from fork to exit
(`os.wait4`). Prints the medians per rank and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, tiny_run_folder

SIDES = ("built by each rank", "built by the launcher")

# One launcher: reads a line per world (RUN_DIR PORT), forks its ranks, prints their CPU seconds.
LAUNCHER = """
import json, os, subprocess, sys
from clusterfsdp.worker import main, warmstart
if sys.argv[1] == "0":
    warmstart.fill_caches = lambda: None
launcher = warmstart.Launcher()
def serve():
    note = launcher.preload(None, (*main.RANK_MODULES, "transformers.models.llama.modeling_llama"))
    print(json.dumps({"note": note}), flush=True)
    for line in sys.stdin:
        run, port, world = line.split()
        ranks = []
        for rank in range(int(world)):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": world,
                   "LOCAL_WORLD_SIZE": world, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                   "CLUSTERFSDP_JOB_ID": "b" + port, "OMP_NUM_THREADS": "1"}
            ranks.append(launcher.start([sys.executable, "-u", "-m", "clusterfsdp.worker", run], env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        cpu = []
        for r in ranks:
            _, status, usage = os.wait4(r.pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, status
            cpu.append(usage.ru_utime + usage.ru_stime)
        print(json.dumps({"cpu": cpu}), flush=True)
sys.exit(warmstart.run_main(serve))
"""


def main() -> None:
    from clusterfsdp.worker import distenv

    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--world", type=int, default=2)
    args = p.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_", "CLUSTERFSDP_"))}
    env |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    launchers = {}
    for k, side in enumerate(SIDES):
        argv = [sys.executable, "-c", LAUNCHER, str(k)]
        pipe = subprocess.PIPE
        launchers[side] = subprocess.Popen(argv, stdin=pipe, stdout=pipe, text=True, env=env, cwd=ROOT)
    for side, proc in launchers.items():
        assert proc.stdout is not None
        print(f"{side}: {json.loads(proc.stdout.readline())['note']}")
    cpu: dict[str, list[float]] = {side: [] for side in SIDES}
    n = 0
    with tempfile.TemporaryDirectory() as name:
        for round_ in range(args.repeat):
            for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
                proc = launchers[side]
                assert proc.stdin is not None and proc.stdout is not None
                n += 1
                run = tiny_run_folder(Path(name), f"forkedrank{n}", args.steps)
                proc.stdin.write(f"{run} {distenv.free_master_port()} {args.world}\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
                if not line:
                    raise SystemExit(f"{side}: the launcher ended")
                per_rank = json.loads(line)["cpu"]
                cpu[side].extend(per_rank)
                print(f"round {round_ + 1} {side}: " + ", ".join(f"{c:.2f} s" for c in per_rank))
    for proc in launchers.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    print(f"\n{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; median per rank of {args.repeat} worlds")
    each, once = (statistics.median(cpu[side]) for side in SIDES)
    print(f"{SIDES[0]} {each:.2f} s, {SIDES[1]} {once:.2f} s, ratio {each / once:.2f}")


if __name__ == "__main__":
    main()
