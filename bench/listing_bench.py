"""CPU only: what listing many runs costs (issue 29 item 6): `runs --limit N` and
`runs --limit N --json` over a run root of N finished runs, each with a metrics.jsonl of
`--rows` logged steps (with an evaluation every 10th), a few events and one checkpoint. Prints
the wall time and peak RSS of each command (one process each, measured by /usr/bin/time) and the
ratio of `--json` to the table, both from the same run.

    python bench/listing_bench.py [--runs 10000] [--rows 300] [--root DIR] [--tree DIR]

`--tree DIR` measures another source tree, e.g. an older commit for before/after
(`common.python_for`).

The run root is built once (copies of one run folder made by the TUI tests' `make_run`) under
`--root` (default: a temporary directory, removed afterwards; given, it is kept and reused).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, python_for


def build(root: Path, runs: int, rows: int) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from tui_helpers import make_run

    if len(list(root.glob("*/*/state.json"))) == runs:
        return
    template = make_run(root / ".template", "20250101-000000-tmpl", checkpoints=(rows,), log_lines=1, ranks=1)
    lines = []
    for step in range(1, rows + 1):
        lines.append(json.dumps({"step": step, "loss": 5.0 - step / rows, "lr": 3e-4, "grad_norm": 0.5,
                                 "tokens_per_s": 20000.0, "elapsed_s": float(step), "attempt": 0}))  # fmt: skip
        if step % 10 == 0:
            lines.append(json.dumps({"step": step, "eval_loss": 5.1 - step / rows, "eval_ppl": 10.0}))
    template.metrics_file.write_text("\n".join(lines) + "\n")
    for shard in template.path.glob("checkpoints/*/*.distcp"):
        shard.write_bytes(b"x")  # listing reads no checkpoint payload: keep the copies small
    for i in range(runs):
        shutil.copytree(template.path, root / "bench" / f"20260101-{i:06d}-aaaa")
    shutil.rmtree(root / ".template")


def measure(argv: list[str], cwd: Path) -> tuple[float, float, int]:
    """(seconds, peak RSS in MB, bytes printed) of one command (run in `cwd`: not this tree)."""
    with tempfile.TemporaryFile() as out:
        time_it = ["/usr/bin/time", "-f", "%e %M", *argv]
        r = subprocess.run(time_it, stdout=out, stderr=subprocess.PIPE, text=True, cwd=cwd)
        size = out.tell()
    if r.returncode != 0:
        raise SystemExit(f"{argv}: exit {r.returncode}: {r.stderr[-500:]}")
    seconds, kb = r.stderr.strip().splitlines()[-1].split()
    return float(seconds), int(kb) / 1024, size


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--rows", type=int, default=300)
    p.add_argument("--root", type=Path)
    p.add_argument("--tree", type=Path, help="the source tree to measure (default: this one)")
    args = p.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="listing-bench-"))
    try:
        build(root, args.runs, args.rows)
        python = python_for(args.tree)
        cli = [*python, "-m", "clusterfsdp", "runs", "--limit", str(args.runs), "--run-root", str(root)]
        table = measure(cli, root)
        as_json = measure([*cli, "--json"], root)
        print(f"{args.runs} runs of {args.rows} logged steps each")
        print(f"{'command':<22} {'seconds':>8} {'peak RSS MB':>12} {'output MB':>10}")
        for name, (s, mb, size) in (("runs", table), ("runs --json", as_json)):
            print(f"{name:<22} {s:>8.2f} {mb:>12.0f} {size / 1e6:>10.1f}")
        print(f"runs --json / runs: {as_json[0] / table[0]:.2f}x time, {as_json[1] / table[1]:.2f}x memory")
    finally:
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
