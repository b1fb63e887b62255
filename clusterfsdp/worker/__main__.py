"""`python -m clusterfsdp.worker RUN_DIR`: one rank of a run (what a dry-run sbatch script runs)."""

import sys

from .main import run

if len(sys.argv) != 2:
    sys.exit("usage: python -m clusterfsdp.worker RUN_DIR")
run(sys.argv[1])
