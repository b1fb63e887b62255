"""Nodes that stay bad (issue 39 item 4): the cluster's shared node record. What is quarantined
and for how long, never excluding so many that a job cannot fit, concurrent writers, a team
sharing one record through $CLUSTERFSDP_TRUSTED_GROUP, and a record another user could have
written never used nor written through. The devcluster half (a node that failed its pre-flight
left out of the next run, `nodes clear`) is in test_slurm_e2e's pre-flight test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterfsdp.control import noderecord
from clusterfsdp.control.noderecord import BAD, CLEAR, Mark
from clusterfsdp.core import ownership

HOUR = 3600.0


def test_the_last_line_of_a_node_decides_and_marks_expire():
    now = time.time()
    marks = [
        Mark("n1", BAD, now - 2 * HOUR, "pre-flight", "preflight"),
        Mark("n2", BAD, now - 30 * HOUR, "hang", "hang"),  # older than 24 h
        Mark("n3", BAD, now - HOUR, "lost", "node_failure"),
        Mark("n3", CLEAR, now - 0.5 * HOUR),
        Mark("n4", CLEAR, now - 3 * HOUR),
        Mark("n4", BAD, now - 0.1 * HOUR, "again", "hang"),
    ]
    assert sorted(noderecord.quarantined(marks, now, 24)) == ["n1", "n4"]
    assert sorted(noderecord.quarantined(marks, now, 48)) == ["n1", "n2", "n4"]
    assert noderecord.quarantined(marks, now, 0) == {}  # slurm.quarantine_hours = 0: never


def test_a_job_is_never_left_without_enough_nodes_and_the_newest_marks_win():
    now = time.time()
    bad = {n: Mark(n, BAD, now - age * HOUR) for n, age in (("n1", 3), ("n2", 1), ("n3", 2))}
    partition = {"n1": "idle", "n2": "mixed", "n3": "idle", "n4": "idle", "n5": "down*"}
    assert noderecord.exclusions(bad, partition, 1) == (("n1", "n2", "n3"), ())
    assert noderecord.exclusions(bad, partition, 2) == (("n2", "n3"), ("n1",))  # n1 is the oldest mark
    assert noderecord.exclusions(bad, partition, 4) == ((), ("n1", "n2", "n3"))
    assert noderecord.exclusions(bad, partition, 3, already=("n4",)) == ((), ("n1", "n2", "n3"))
    gone = {"n9": Mark("n9", BAD, now)}  # not in the partition: excluded freely, it cannot be picked anyway
    assert noderecord.exclusions(gone, partition, 4) == (("n9",), ())


_WRITER = """
import sys
from pathlib import Path
from clusterfsdp.control import noderecord
path, who = Path(sys.argv[1]), sys.argv[2]
for i in range(40):
    noderecord.mark(path, [f"{who}-{i}"], reason="x" * 200, cause="hang", run=who)
"""


def test_concurrent_writers_never_corrupt_the_record(tmp_path):
    path = tmp_path / "root" / ".nodes" / "c.jsonl"
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), f"w{k}"], stderr=subprocess.PIPE, text=True)
        for k in range(6)
    ]
    assert all(p.wait(timeout=300) == 0 for p in writers), [p.stderr.read() for p in writers if p.stderr]
    lines = path.read_text().splitlines()
    assert len(lines) == 240 and all(json.loads(line)["action"] == BAD for line in lines)
    marks, note = noderecord.read(path)
    assert note == "" and {m.node for m in marks} == {f"w{k}-{i}" for k in range(6) for i in range(40)}


def test_a_teams_record_is_shared_and_anyone_elses_is_not_used(tmp_path, other_user, shared_root, monkeypatch):
    """With $CLUSTERFSDP_TRUSTED_GROUP the record is the group's (2775 folder, 0664 file): a member
    sees your marks and adds their own. Without it, another user's record is not used (one note)
    and a link they put in its place is never written through."""
    group = str(other_user.gid)
    monkeypatch.setenv(ownership.ENV_TRUSTED_GROUP, group)
    path = noderecord.record_path(shared_root / "runs", "c1")
    noderecord.mark(path, ["node2"], reason="pre-flight failed", cause="preflight", run="r1")
    assert (path.parent.stat().st_mode & 0o7777, path.stat().st_mode & 0o777) == (0o2775, 0o664)
    assert path.stat().st_gid == other_user.gid
    env = {**os.environ, ownership.ENV_TRUSTED_GROUP: group}
    argv = ["nodes", "--json", "--cluster", "c1", "--run-root", str(shared_root / "runs")]
    seen = other_user.run([sys.executable, "-m", "clusterfsdp", *argv], env=env)
    assert seen.returncode == 0, seen.stderr
    assert [m["node"] for m in json.loads(seen.stdout)["quarantined"]] == ["node2"]
    code = (
        "import sys; from pathlib import Path; from clusterfsdp.control import noderecord as n; "
        "n.mark(n.record_path(Path(sys.argv[1]), 'c1'), ['node3'], reason='hang', cause='hang', run='r2')"
    )
    added = other_user.run([sys.executable, "-c", code, str(shared_root / "runs")], env=env)
    assert added.returncode == 0, added.stderr
    assert sorted(noderecord.quarantined(noderecord.read(path)[0], time.time(), 24)) == ["node2", "node3"]

    monkeypatch.delenv(ownership.ENV_TRUSTED_GROUP)  # no team: the record belongs to nobody you trust
    marks, note = noderecord.read(path)
    assert marks == [] and "its quarantines are not used" in note and "writable by group" in note, note
    theirs = shared_root / "theirs"
    other_user.plant(theirs, {".nodes/README": b""})
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    link = noderecord.record_path(theirs, "c1")
    os.symlink(victim, link)
    with pytest.raises(ownership.Refused, match="refusing to write the node record there"):
        noderecord.mark(link, ["node9"], reason="x", cause="hang", run="r3")
    assert victim.read_text() == "mine\n"


def test_an_unreadable_line_is_skipped_not_fatal(tmp_path):
    path = tmp_path / ".nodes" / "c.jsonl"
    noderecord.mark(path, ["a"], reason="r", cause="hang", run="x")
    with open(path, "a") as f:
        f.write('{"node": 5, "action": "bad", "time": 1}\n{"node": "b", "action": "bad", "time": 1e300}\n[1, 2]\n{"nod')
    marks, note = noderecord.read(path)
    assert [m.node for m in marks] == ["a"] and note == ""


def test_nodes_command_lists_and_clears(tmp_path):
    root = tmp_path / "runs"
    noderecord.mark(
        noderecord.record_path(root, "c1"), ["node2"], reason="pre-flight failed", cause="preflight", run="r1"
    )

    def cli(*args: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "clusterfsdp", "nodes", *args, "--cluster", "c1", "--run-root", str(root)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    listed = cli()
    assert listed.returncode == 0 and "node2 (preflight: pre-flight failed; run r1 by root" in listed.stdout
    assert "h left" in listed.stdout
    assert cli("clear", "node2").returncode == 0
    assert "no node quarantined" in cli().stdout
    assert [m["action"] for m in json.loads(cli("--json").stdout)["history"]] == [BAD, CLEAR]
    assert Path(json.loads(cli("--json").stdout)["record"]) == root / ".nodes" / "c1.jsonl"
