"""`clusterfsdp nodes`: the cluster's node record (control/noderecord.py) for people and scripts:
the quarantined nodes with why, when, which run and who, `nodes clear NODE...` to end a
quarantine, and `--json` for an admin's report."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..core import slurmcli
from ..core.spec.schema import SlurmSection
from . import noderecord


def record(run_root: Path, cluster: str) -> Path:
    return noderecord.record_path(run_root, cluster or slurmcli.cluster_name())


def main(args: argparse.Namespace, run_root: Path) -> int:
    path = record(run_root, args.cluster)
    if args.action == "clear":
        if not args.nodes:
            print("nodes clear: name the node(s) to bring back, e.g. `clusterfsdp nodes clear node2`")
            return 2
        noderecord.clear(path, args.nodes)
        print(f"cleared {', '.join(sorted(set(args.nodes)))} in {path}: later submits may use them again")
        return 0
    hours = SlurmSection.quarantine_hours if args.hours is None else args.hours
    marks, note = noderecord.read(path)
    now = time.time()
    bad = noderecord.quarantined(marks, now, hours)
    if args.json:
        print(noderecord.to_json(marks, bad, path))
        return 0
    if note:
        print(note)
    if not bad:
        print(f"no node quarantined in the last {hours:g} h ({path})")
        return 0
    print(f"quarantined (excluded from submits for {hours:g} h after the mark; {path}):")
    for node in sorted(bad):
        left = (bad[node].time + hours * 3600 - now) / 3600
        print(f"  {noderecord.describe(bad[node], now)}; {left:.1f} h left")
    return 0
