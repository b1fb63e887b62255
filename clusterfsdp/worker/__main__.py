"""`python -m clusterfsdp.worker RUN_DIR`: one rank of a run (what a dry-run sbatch script runs)."""

import sys

from .main import run

if __name__ == "__main__":  # not when a spawned data-prepare process imports this as __mp_main__
    if len(sys.argv) != 2:
        sys.exit("usage: python -m clusterfsdp.worker RUN_DIR")
    run(sys.argv[1])
