"""A corrupt run folder never breaks listing, `status` or the TUI (issue 29 item 5).

Each variant below damages one file the control plane reads (state.json, events.jsonl,
metrics.jsonl) the way a crash, a full disk, a hand edit or another program can: truncated,
empty, not UTF-8, NUL bytes, not a JSON object, wrong types, missing keys, values of a newer
writer, a huge line, nesting deeper than any parser's stack (RecursionError), numbers beyond any
time or float (OverflowError), and files that are no regular file: a FIFO (opening it waits for a
writer: `runs` and the TUI hung for every user of a shared run root), a socket, a link to
/dev/zero (a read never ends), a dangling or looping link. One run root holds every variant
beside a healthy run; `status` of each,
`runs`, `runs --json` and the TUI's queue must all answer without a traceback, list every run, and
show the healthy one as before. A run whose state.json cannot be read is listed as UNREADABLE with
the reason; damaged lines of the append-only files are skipped (a torn last line is normal there).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from tui_helpers import FakeSlurm, make_run, run_app, settle

from clusterfsdp import cli
from clusterfsdp.core import fileio
from clusterfsdp.core.records import RunState
from clusterfsdp.tui.app import ClusterApp

GOOD_ATTEMPT = {"attempt": 0, "job_id": "1001", "executor": "local", "submitted": 1.0, "reason": "submit"}
GOOD_STATE = {"run_id": "x", "name": "tiny-cpu", "executor": "local", "created": 1.0, "attempts": [GOOD_ATTEMPT]}
GOOD_EVENT = {"event": "start", "job_id": "1001", "restart": 0, "rank": 0, "host": "node1", "time": 5.0}
GOOD_ROW = {"step": 10, "loss": 4.0}


def _state(**changes: object) -> bytes:
    return json.dumps({**GOOD_STATE, **changes}).encode()


def _attempt(**changes: object) -> bytes:
    return _state(attempts=[{**GOOD_ATTEMPT, **changes}])


def _event(**changes: object) -> bytes:
    return json.dumps({**GOOD_EVENT, **changes}).encode() + b"\n"


def _row(**changes: object) -> bytes:
    return json.dumps({**GOOD_ROW, **changes}).encode() + b"\n"


HUGE = b'{"step": 1, "loss": "' + b"x" * (8 << 20) + b'"}\n'
DEEP = b"[" * 100_000 + b"]" * 100_000  # beyond json's own recursion limit
NESTED = b"[" * 900 + b"]" * 900  # within json's limit, beyond what repr/dumps of it survive deeper in a stack

# (file, content): what each variant writes over the healthy run's file.
VARIANTS: dict[str, tuple[str, bytes]] = {
    "state-truncated": ("state.json", _state()[:40]),
    "state-empty": ("state.json", b""),
    "state-not-utf8": ("state.json", b'{"run_id": "\xff\xfe"}'),
    "state-nul": ("state.json", b"\x00" * 64),
    "state-list": ("state.json", b"[1, 2]"),
    "state-string": ("state.json", b'"state"'),
    "state-null": ("state.json", b"null"),
    "state-number": ("state.json", b"42"),
    "state-attempts-dict": ("state.json", _state(attempts={"0": GOOD_ATTEMPT})),
    "state-attempts-null": ("state.json", _state(attempts=None)),
    "state-attempt-number": ("state.json", _state(attempts=[7])),
    "state-attempt-no-job-id": ("state.json", _state(attempts=[{"attempt": 0, "executor": "local"}])),
    "state-attempt-job-id-dict": ("state.json", _attempt(job_id={"a": 1})),
    "state-attempt-unknown-executor": ("state.json", _attempt(executor="k8s")),
    "state-unknown-executor": ("state.json", _state(executor="k8s")),
    "state-created-string": ("state.json", _state(created="yesterday")),
    "state-submitted-string": ("state.json", _attempt(submitted="now")),
    "state-leader-string": ("state.json", _attempt(leader="1234")),
    "state-leader-pid-zero": ("state.json", _attempt(leader={"pid": 0, "start": 1, "host": "h", "boot": "b"})),
    "state-leader-pid-string": ("state.json", _attempt(leader={"pid": "x", "start": "y"})),
    "state-resume-step-string": ("state.json", _attempt(resume_step="ten")),
    "state-exit-codes-list": ("state.json", _attempt(exit_codes=[1, 2])),
    "state-cause-unknown": ("state.json", _attempt(cause="cosmic_ray")),
    "state-reason-number": ("state.json", _attempt(reason=12)),
    "state-huge-reason": ("state.json", _attempt(reason="r" * (4 << 20))),
    "events-truncated": ("events.jsonl", _event()[:30]),
    "events-empty": ("events.jsonl", b""),
    "events-not-utf8": ("events.jsonl", _event() + b'{"event": "completed", "\xff": 1}\n'),
    "events-nul": ("events.jsonl", b"\x00" * 100 + b"\n" + _event()),
    "events-list-line": ("events.jsonl", b"[1, 2, 3]\n" + _event()),
    "events-unknown-kind": ("events.jsonl", _event() + _event(event="teleported")),
    "events-no-job-id": ("events.jsonl", _event() + b'{"event": "completed", "restart": 0}\n'),
    "events-restart-string": ("events.jsonl", _event() + _event(event="completed", restart="zero")),
    "events-time-string": ("events.jsonl", _event() + _event(event="completed", time="late")),
    "events-step-string": ("events.jsonl", _event() + _event(event="failed", step="ten", reason="x")),
    "events-reason-dict": ("events.jsonl", _event() + _event(event="failed", reason={"a": 1})),
    "events-nodes-string": ("events.jsonl", _event() + _event(event="gave_up", failed_nodes="node1")),
    "events-huge-line": ("events.jsonl", _event() + b'{"event": "failed", "reason": "' + b"e" * (8 << 20) + b'"}\n'),
    "metrics-not-utf8": ("metrics.jsonl", _row() + b'{"step": 20, "loss": 3.0, "note": "\xff\xfe"}\n'),
    "metrics-nul": ("metrics.jsonl", b"\x00" * 4096),
    "metrics-step-string": ("metrics.jsonl", _row() + _row(step="20")),
    "metrics-loss-string": ("metrics.jsonl", _row() + _row(step=20, loss="low")),
    "metrics-loss-bool": ("metrics.jsonl", _row(loss=True)),
    "metrics-eval-string": ("metrics.jsonl", _row() + _row(step=20, loss=None, eval_loss="x")),
    "metrics-list-rows": ("metrics.jsonl", b"[10, 4.0]\n[20, 3.0]\n"),
    "metrics-truncated": ("metrics.jsonl", _row() + _row(step=20)[:9]),
    "metrics-huge-line": ("metrics.jsonl", _row() + HUGE),
    "state-deep": ("state.json", DEEP),
    "state-deep-object": ("state.json", b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
    "state-nested-reason": ("state.json", _attempt()[:-3] + b', "reason": ' + NESTED + b"}]}"),
    "state-created-1e300": ("state.json", _state(created=1e300)),
    "state-submitted-1e300": ("state.json", _attempt(submitted=1e300)),
    "state-submitted-nan": ("state.json", _attempt(submitted=float("nan"))),
    "state-cancelled-inf": ("state.json", _attempt(cancelled=float("-inf"))),
    "state-created-huge-int": ("state.json", _state(created=10**400)),
    "state-resume-step-huge": ("state.json", _attempt(resume_step=10**30)),
    "state-leader-pid-inf": ("state.json", _attempt(leader={"pid": 1e300, "start": 1, "host": "h", "boot": "b"})),
    "events-deep": ("events.jsonl", _event() + DEEP + b"\n"),
    "events-nested-reason": ("events.jsonl", _event() + _event(event="failed")[:-2] + b', "x": ' + NESTED + b"}\n"),
    "events-time-1e300": ("events.jsonl", _event() + _event(event="completed", time=1e300, step=40)),
    "events-time-nan": ("events.jsonl", _event(time=float("nan")) + _event(event="failed", time=float("inf"))),
    "events-step-huge": ("events.jsonl", _event() + _event(event="failed", step=10**30, reason="x")),
    "metrics-deep": ("metrics.jsonl", _row() + b'{"step": 20, "loss": 3.0, "x": ' + DEEP + b"}\n"),
    "metrics-nested": ("metrics.jsonl", _row() + b'{"step": 20, "loss": 3.0, "x": ' + NESTED + b"}\n"),
    "metrics-1e300": ("metrics.jsonl", _row(loss=1e300, epoch=1e300, eval_loss=1e300, time=1e300)),
    "metrics-loss-beyond-float": ("metrics.jsonl", _row() + _row(step=20, loss=10**400, eval_loss=10**400)),
    "metrics-nan": ("metrics.jsonl", _row(loss=float("nan"), epoch=float("inf"), eval_loss=float("nan"))),
    "metrics-step-huge": ("metrics.jsonl", _row() + _row(step=10**30, total_steps=10**30)),
    "job-toml-deep": ("job.toml", b"[train]\nsteps = " + b"[" * 100_000 + b"]" * 100_000 + b"\n"),
    "trackers-deep": ("trackers.json", DEEP),
}
# Files that are no regular file, made in place of the healthy run's file: (file, kind).
SPECIAL: dict[str, tuple[str, str]] = {
    "state-fifo": ("state.json", "fifo"),
    "state-socket": ("state.json", "socket"),
    "state-dev-zero": ("state.json", "/dev/zero"),
    "events-fifo": ("events.jsonl", "fifo"),
    "events-dev-zero": ("events.jsonl", "/dev/zero"),
    "events-loop": ("events.jsonl", "loop"),
    "metrics-fifo": ("metrics.jsonl", "fifo"),
    "metrics-dev-zero": ("metrics.jsonl", "/dev/zero"),
    "metrics-dangling": ("metrics.jsonl", "dangling"),
    "job-toml-fifo": ("job.toml", "fifo"),
    "job-toml-dev-zero": ("job.toml", "/dev/zero"),
    "trackers-fifo": ("trackers.json", "fifo"),
    "data-json-fifo": ("data.json", "fifo"),
    "lock-fifo": (".lock", "fifo"),
    "log-fifo": ("logs/1001.0/rank0.log", "fifo"),
    "node-record-fifo": ("nodes/1001.0/node1.json", "fifo"),
    "checkpoint-meta-fifo": ("checkpoints/step-00000020/clusterfsdp.json", "fifo"),
}
# A state.json that cannot be read as a RunRecord: the run is listed as UNREADABLE.
ALL = [*VARIANTS, *SPECIAL]
UNREADABLE = {name for name, (file, _) in {**VARIANTS, **SPECIAL}.items() if file == "state.json"} - {
    "state-leader-pid-zero",  # a valid record; the pid is refused where it is used (procs)
    "state-leader-pid-inf",  # the same: a pid beyond pid_max
    "state-cause-unknown",  # a newer writer's cause reads as `unknown`
    "state-huge-reason",  # large, but a valid record
}
HEALTHY = "20260101-120000-good"


def _make_special(path: Path, kind: str) -> None:
    path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        os.mknod(path, stat.S_IFSOCK | 0o644)
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "dangling":
        path.symlink_to(path.parent / "no-such-file")
    else:
        path.symlink_to(kind)


def _run_id(i: int) -> str:
    return f"20251201-{i:06d}-bad0"


@pytest.fixture(scope="module")
def corrupt_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corrupt")
    make_run(root, HEALTHY, checkpoints=(), log_lines=2, ranks=1)
    for i, name in enumerate(ALL):
        special = name in SPECIAL
        run = make_run(root, _run_id(i), checkpoints=(20,) if special else (), end="failed" if special else "completed",
                       log_lines=2, ranks=1)  # fmt: skip
        if name in VARIANTS:
            (run.path / VARIANTS[name][0]).write_bytes(VARIANTS[name][1])
        else:
            _make_special(run.path / SPECIAL[name][0], SPECIAL[name][1])
    return root


def test_there_are_enough_variants():
    assert len(VARIANTS) >= 70 and len(SPECIAL) >= 15


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))  # an exception escaping main() is the traceback a user would see
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.timeout(60)  # a FIFO opened for reading would block forever: fail instead
@pytest.mark.parametrize("variant", ALL)
def test_status_of_a_corrupt_run_answers_without_a_traceback(corrupt_root, capsys, variant):
    i = ALL.index(variant)
    code, out, err = _main(capsys, "status", _run_id(i), "--run-root", str(corrupt_root))
    if variant in UNREADABLE:
        assert code == 1 and "state      UNREADABLE - state.json: " in out, out + err
    else:
        assert code in (0, 1) and "state      " in out and "UNREADABLE" not in out, out + err
    code, out, err = _main(capsys, "status", _run_id(i), "--json", "--run-root", str(corrupt_root))
    doc = json.loads(out)
    assert doc["run_id"] == _run_id(i) and (doc["state"] == "UNREADABLE") == (variant in UNREADABLE)
    if variant in UNREADABLE:
        assert doc["reason"].startswith("state.json: ") and doc["bad"] is True
    if variant in SPECIAL:  # a failed run: doctor reads its logs, node records and checkpoints
        for command in ("doctor", "logs"):
            code, out, err = _main(capsys, command, _run_id(i), "--run-root", str(corrupt_root))
            assert code in (0, 1, 2) and (code != 2 or err.count("\n") == 1), (command, out, err)


def test_runs_lists_every_run_with_the_unreadable_ones_marked(corrupt_root, capsys):
    code, out, err = _main(capsys, "runs", "--limit", "1000", "--run-root", str(corrupt_root))
    assert code == 0, err
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(lines) == {HEALTHY, *(_run_id(i) for i in range(len(ALL)))}
    assert "COMPLETED" in lines[HEALTHY] and "40/40" in lines[HEALTHY]
    for i, name in enumerate(ALL):
        assert ("UNREADABLE" in lines[_run_id(i)]) == (name in UNREADABLE), (name, lines[_run_id(i)])

    code, out, err = _main(capsys, "runs", "--json", "--limit", "1000", "--run-root", str(corrupt_root))
    assert code == 0, err
    rows = {r["run_id"]: r for r in json.loads(out)["runs"]}
    assert len(rows) == len(ALL) + 1 and rows[HEALTHY]["state"] == "COMPLETED" and rows[HEALTHY]["step"] == 40
    for i, name in enumerate(ALL):
        row = rows[_run_id(i)]
        assert (row["state"] == RunState.UNREADABLE) == (name in UNREADABLE), (name, row["state"])
        assert row["step"] is None or type(row["step"]) is int
        assert row["loss"] is None or type(row["loss"]) is float


def test_tui_queue_lists_every_corrupt_run_and_keys_work(corrupt_root):
    """The real app over the corrupt root: every run is a row (unreadable ones say why), and
    moving through all of them with the keys never crashes the app."""
    app = ClusterApp(corrupt_root, FakeSlurm())

    async def scenario(pilot):
        await settle(pilot)
        rows = {r.run.id: r for r in app.rows if r.run}
        assert len(rows) == len(ALL) + 1
        assert rows[HEALTHY].state == "COMPLETED"
        for i, name in enumerate(ALL):
            row = rows[_run_id(i)]
            assert (row.state == "UNREADABLE") == (name in UNREADABLE), (name, row)
            if name in UNREADABLE:
                assert row.reason.startswith("state.json: ")
        for key in ["down"] * (len(ALL) + 2) + ["up", "pageup", "pagedown", "end", "home"]:
            await pilot.press(key)
        await pilot.pause()
        assert app.return_code is None and app.current_key in {r.key for r in app.rows}

    run_app(app, scenario)


def test_tui_queue_on_an_empty_run_root_ignores_the_keys(tmp_path):
    """A new user's first start: no runs at all. Up, PageDown, Down and Enter do nothing (they
    crashed the app on a row key of None) and the queue says how to start."""
    app = ClusterApp(tmp_path / "runs", FakeSlurm())

    async def scenario(pilot):
        await settle(pilot)
        for key in ("up", "pagedown", "down", "pageup", "enter", "end", "home"):
            await pilot.press(key)
        await pilot.pause()
        assert app.return_code is None and app.rows == [] and app.current_key is None
        assert type(app.screen).__name__ == "QueueScreen"

    run_app(app, scenario)


def test_read_jsonl_skips_lines_that_are_not_utf8(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(_row() + b'{"step": 2, "x": "\xff"}\n' + _row(step=30))
    assert [r["step"] for r in fileio.read_jsonl(path)] == [10, 30]


def test_jsonl_tail_hands_out_complete_rows_once_and_skips_damaged_lines(tmp_path):
    """The one tail of the TUI's charts and the notebook's progress (control.jsonltail)."""
    from clusterfsdp.control.jsonltail import JsonlTail

    path = tmp_path / "metrics.jsonl"
    tail = JsonlTail(path)
    assert tail.new_rows() == []  # no file yet
    path.write_bytes(_row(step=1) + b'{"step": 2, "x": "\xff"}\n' + b"[1]\n" + _row(step=3)[:5])
    assert [r["step"] for r in tail.new_rows()] == [1]  # not UTF-8, not an object: skipped; torn: later
    with open(path, "ab") as f:
        f.write(_row(step=3)[5:] + b"z" * 5000 + b"\n" + _row(step=4))
    chunks = tail.read_new(chunk_bytes=1024)  # a line longer than a chunk is skipped, a chunk at a time
    assert [r["step"] for rows in chunks for r in rows] == [3, 4]
    assert tail.new_rows() == [] and tail.offset == path.stat().st_size
