"""`python -m clusterfsdp.tui`: what textual-serve starts for each browser session."""

from __future__ import annotations

import argparse
import sys

from . import main

parser = argparse.ArgumentParser(prog="python -m clusterfsdp.tui")
parser.add_argument("--run-root", default="./runs")
parser.add_argument("--serve", action="store_true")
parser.add_argument("--port", type=int, default=8000)
parser.add_argument("--allow-origin", action="append", default=[])
parser.add_argument("--refresh", type=float, help="seconds between queue refreshes (default 10)")
sys.exit(main(parser.parse_args()))
