"""Sweeps (`clusterfsdp sweep`, issue 28) without Slurm: the grid typed by the schema, bad input
refused whole before anything is made, the sweep record, and a real local sweep (two tiny
points trained one after another by the local driver, then cancelled mid-point). The job
array on the devcluster is tests/test_sweep_slurm.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

import clusterfsdp
from clusterfsdp.cli import build_parser, main, sweepcmds
from clusterfsdp.control import status, sweepplan
from clusterfsdp.control.sweepfolder import all_sweeps
from clusterfsdp.core.records import Executor, RecordError, SweepPoint, SweepRecord
from clusterfsdp.core.spec.schema import MAX_SWEEP_POINTS


def sweep_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["sweep", *args])
    out, err = capsys.readouterr()
    return code, out, err


ZIP_LENGTHS = "error: zipped lists must have one length: train.lr has 2, train.warmup has 3"
BAD_POINT = "error: point 1 (train.lr=0.001 train.micro_batch_size=0): train.micro_batch_size: must be >= 1, found 0"
HUNDRED = ",".join(map(str, range(1, 101)))
TOO_MANY = f"error: the sweep has 10000 points; at most {MAX_SWEEP_POINTS} (docs/sweeps.md): split it"
GPUS = ["--set", "slurm.gpus_per_node=2", "--set", "slurm.time=60", "--set", "slurm.max_gpu_hours=5"]
OVER_BUDGET = (  # issue 39: the points' plans together, not one attempt's, are held against the budget
    "error: slurm.max_gpu_hours = 5 bounds the whole sweep: its 3 points may use 6.00 GPU-h (2.00 GPU-h each: "
    "1 node(s) x 2 GPU(s) x 60 min); lower slurm.time or slurm.nodes, sweep fewer points, or raise slurm.max_gpu_hours"
)
BUDGET_VARIED = (
    "error: --grid slurm.max_gpu_hours: a sweep cannot vary slurm.max_gpu_hours (it bounds the sweep as a whole: "
    "its points share it)"
)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--grid", "train.lrr=1e-3,3e-3"], "error: --grid train.lrr: unknown key; did you mean lr?"),
        (["--grid", "train.lr=1e-3,fast"], "error: --grid train.lr: expected number, found string 'fast'"),
        (["--grid", "train.lr="], "error: --grid train.lr: an empty list (give at least one value)"),
        (["--grid", "job.name=a,b"], "error: --grid job.name: a sweep cannot vary job.name (its points share it)"),
        (["--zip", "train.lr=1e-3,3e-3", "--zip", "train.warmup=1,2,3"], ZIP_LENGTHS),
        (["--grid", "train.lr=1e-3", "--grid", "train.micro_batch_size=2,0"], BAD_POINT),
        (["--grid", f"train.steps=[{HUNDRED}]", "--grid", f"train.warmup=[{HUNDRED}]"], TOO_MANY),
        (["--grid", "train.lr=1e-3,3e-3,1e-2", *GPUS], OVER_BUDGET),
        (["--grid", "slurm.max_gpu_hours=5,10"], BUDGET_VARIED),
    ],
    ids=[
        "unknown-key",
        "wrong-type",
        "empty",
        "fixed-key",
        "zip-lengths",
        "bad-point",
        "10000-points",
        "over-budget",
        "budget-varied",
    ],
)
def test_bad_sweeps_are_one_line_exit_2_and_leave_nothing(tiny_job, tmp_path, capsys, args, line):
    code, out, err = sweep_cli(capsys, str(tiny_job), "--executor", "local", *args)
    assert (code, out, err.splitlines()[-1]) == (2, "", line), err
    assert "Traceback" not in err and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("table", "line"),
    [
        ('grid = { "train.lrr" = [1e-3] }', "error: sweep.grid train.lrr: unknown key; did you mean lr?"),
        ('grid = { "train.lr" = [1e-3, "fast"] }', "error: sweep.grid train.lr: expected number, found string 'fast'"),
        ('grid = { "train.lr" = [] }', "error: sweep.grid train.lr: an empty list (give at least one value)"),
        (
            'grid = { "job.name" = ["a", "b"] }',
            "error: sweep.grid job.name: a sweep cannot vary job.name (its points share it)",
        ),
        ('zip = { "train.lr" = [1e-3, 3e-3], "train.warmup" = [1, 2, 3] }', ZIP_LENGTHS),
        ('grid = { "train.lr" = [1e-3], "train.micro_batch_size" = [2, 0] }', BAD_POINT),
        (
            'max_parallel = -1\ngrid = { "train.lr" = [1e-3] }',
            "error: sweep.max_parallel = -1: expected 0 (no limit on Slurm, 1 locally) or more",
        ),
    ],
    ids=["unknown-key", "wrong-type", "empty", "fixed-key", "zip-lengths", "bad-point", "negative-parallel"],
)
def test_validate_refuses_the_sweep_tables_that_sweep_refuses(tiny_job, capsys, table, line):
    """Reproduced: `validate` said ok to a [sweep] table that `sweep` then refused (and `submit`
    refuses every job with one). It runs the same check, with the same line."""
    tiny_job.write_text(tiny_job.read_text() + f"\n[sweep]\n{table}\n")
    code, _, err = sweep_cli(capsys, str(tiny_job), "--executor", "local", "--dry-run")
    assert (code, err.splitlines()[-1]) == (2, line), err
    assert main(["validate", str(tiny_job)]) == 2
    assert capsys.readouterr().err.splitlines() == [line]


def test_sweep_table_is_typed_by_the_schema_and_the_command_line_replaces_a_key(tiny_job, capsys):
    """[sweep] in the job file: an int where a float is declared becomes a float (as --set does),
    zipped keys advance together (innermost), a --grid item replaces the table's key; `validate`
    accepts the file, `submit` refuses it (it would train one run), `schema sweep` documents it."""
    text = tiny_job.read_text()
    text += '\n[sweep]\nmax_parallel = 2\ngrid = { "train.max_grad_norm" = [1, 2] }\n'
    text += 'zip = { "train.warmup" = [1, 2], "job.seed" = [5, 6] }\n'
    tiny_job.write_text(text)
    code, out, _ = sweep_cli(capsys, str(tiny_job), "--executor", "local", "--dry-run", "--json",
                             "--grid", "train.micro_batch_size=[2, 4]")  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    assert doc["keys"] == ["train.max_grad_norm", "train.warmup", "job.seed", "train.micro_batch_size"]
    values = [p["values"] for p in doc["points"]]
    first = {"train.max_grad_norm": 1.0, "train.micro_batch_size": 2, "train.warmup": 1, "job.seed": 5}
    assert len(values) == 8 and values[0] == first and type(values[0]["train.max_grad_norm"]) is float
    assert values[1] == {**first, "job.seed": 6, "train.warmup": 2}
    assert main(["submit", str(tiny_job), "--executor", "local"]) == 2
    assert "has a [sweep] table: `clusterfsdp sweep" in capsys.readouterr().err
    assert main(["schema", "sweep"]) == 0 and "max_parallel = 0    (integer)" in capsys.readouterr().out
    tiny_job.write_text(text.replace("max_parallel = 2", "max_paralel = 2"))
    assert main(["validate", str(tiny_job)]) == 2
    assert "sweep.max_paralel: unknown key; did you mean max_parallel?" in capsys.readouterr().err


def test_sweep_record_round_trips_and_rejects_a_wrong_type(tmp_path):
    record = SweepRecord("sw1", "job", Executor.SLURM, 1.0, ["train.lr"], [SweepPoint(0, "1-p0", {"train.lr": 0.1})],
                         max_parallel=1, job_id="77")  # fmt: skip
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(record.to_dict()))
    assert SweepRecord.read(path) == record
    path.write_text(json.dumps({**record.to_dict(), "points": [{"index": "0", "run_id": "x", "values": {}}]}))
    with pytest.raises(RecordError, match=r"sweep.json: points\[0\].index: expected <class 'int'>"):
        SweepRecord.read(path)


@pytest.mark.parametrize(
    ("values", "text"),
    [
        ([1e-4, 3e-4], "0.0001, 0.0003"),
        (["gpu", "a,b", True], '["gpu", "a,b", true]'),
        ([["a.txt"], ["b.txt", "c.txt"]], '[["a.txt"], ["b.txt", "c.txt"]]'),
        ([{"image": "x.sqsh"}], '{ image = "x.sqsh" }'),
        ([], ""),
    ],
    ids=["numbers", "a-comma", "arrays", "a-table", "none"],
)
def test_values_render_as_one_line_that_grid_reads_back(values, text):
    """What the TUI shows a list of values as (`render_values`) is what `--grid KEY=...` reads."""
    assert sweepplan.render_values(values) == text
    assert sweepplan.parse_item(f"k.v={text}", "--grid") == ("k.v", values)


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.timeout(300)
def test_local_sweep_runs_points_in_turn_and_cancel_stops_the_live_one_after_a_save(tiny_job, tmp_path, capsys):
    """Two real points on the local executor, one rank each, `max_parallel` 1: point 0 (3 steps)
    completes before point 1 starts; point 1 (endless) is stopped by `cancel SWEEP` after a save.
    `status SWEEP --sort loss`, `runs` (one line for the sweep) and the handle's DataFrame
    (`clusterfsdp.sweep(...).frame()`) show the points with their values."""
    handle = clusterfsdp.sweep(tiny_job, {"train.steps": [3, 1_000_000]}, executor="local", max_parallel=1,
                               overrides=["slurm.tasks_per_node=1", "train.log_every=1"])  # fmt: skip
    root = tmp_path / "runs"
    assert [s.id for s in all_sweeps(root)] == [handle.id]
    first, second = (handle.sweep.folder.run_folder(p) for p in handle.sweep.record().points)
    waiting = status.run_status(second)  # not a dry run (issue 40: it said so, and that it had ended)
    assert waiting.state == "PENDING" and not waiting.state.final, waiting
    assert waiting.reason == f"waiting for its turn: sweep {handle.id}'s local driver starts its points in order"
    wait_until(lambda: second.metrics(), 240, "point 1 to train a step")
    assert status.run_status(first).state == "COMPLETED"
    assert first.record().attempts[0].submitted < second.record().attempts[0].submitted
    assert first.events()[-1].time <= second.record().attempts[0].submitted  # in turn, never side by side

    assert main(["status", handle.id, "--run-root", str(root), "--sort", "loss"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[2].split()[:3] == ["POINT", "RUN", "train.steps"]
    rows = [row.split() for row in table[3:]]
    assert {r[0]: (r[2], r[3]) for r in rows} == {"0": ("3", "COMPLETED"), "1": ("1000000", "RUNNING")}
    assert [float(r[5]) for r in rows] == sorted(float(r[5]) for r in rows)  # --sort loss
    assert main(["runs", "--run-root", str(root)]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(handle.id) and "sweep of 2 (train.steps)" in line
    best = min(rows, key=lambda r: float(r[5]))  # the point with the lowest loss is named
    assert re.search(rf"; best loss {best[5]} \(point {best[0]}: train\.steps={best[2]}\)$", line), line

    frame = handle.frame()
    assert list(frame.index) == [0, 1] and list(frame["train.steps"]) == [3, 1_000_000]
    assert frame.loc[0, "state"] == "COMPLETED" and frame.loc[0, "final_loss"] > 0

    assert main(["cancel", handle.id[:10], "--run-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"run {first.id}: COMPLETED" and out.splitlines()[1].endswith(": stopped")
    wait_until(lambda: status.run_status(second).state.final, 120, "point 1 to stop")
    stopped = [e for e in second.events() if e.event == "stopped"]
    assert stopped and stopped[-1].checkpoint and Path(stopped[-1].checkpoint).is_dir()  # saved, then stopped
    assert handle.sweep.folder.driver() is not None and handle.sweep.record().cancelled is not None
    # `sweep --follow` on it now: each point's end in a line, the sweep's in the last; exit 1, as
    # point 1 did not complete
    said: list[str] = []
    assert sweepcmds.follow(handle.sweep.folder, said.append, poll_s=0.1) == 1
    assert said[0].startswith(f"point 0 (train.steps=3) run {first.id}: COMPLETED (loss ") and "step 3/3" in said[0]
    assert said[1].startswith(f"point 1 (train.steps=1000000) run {second.id}: ") and len(said) == 3
    assert said[2].startswith(f"sweep {handle.id}: 1 COMPLETED, 1 ") and "; best loss " in said[2]
    assert build_parser().parse_args(["sweep", str(tiny_job), "-f"]).follow


def test_mlflow_runs_of_a_sweeps_points_are_children_of_one_sweep_run(tiny_job, tmp_path, monkeypatch):
    """The worker's MLflow tracker (its real file store; no worker process needed to open it) in
    two points of one sweep folder: one parent run named after the sweep, made once, in the sweep
    folder's store; both points' runs are its children."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from clusterfsdp.control.sweepfolder import SweepFolder
    from clusterfsdp.core import runfolder
    from clusterfsdp.core import spec as S
    from clusterfsdp.worker.trackers import MLflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = S.load(tiny_job, ["job.name=tiny-swab", "log.project=tiny"])
    sweep = SweepFolder(runfolder.job_folder(spec))
    points = [SweepPoint(i, f"1-p{i}", {"train.lr": lr}) for i, lr in enumerate((1e-3, 3e-3))]
    sweep.path.mkdir(parents=True)
    sweep.write_record(SweepRecord("swab", "tiny", Executor.LOCAL, 1.0, ["train.lr"], points))
    children = [MLflow(runfolder.create_run(spec, Executor.LOCAL, p.run_id), spec, 0).run_id for p in points]
    client = MlflowClient(tracking_uri=(sweep.path / "mlruns").as_uri())
    parents = {client.get_run(c).data.tags["mlflow.parentRunId"] for c in children}
    (parent,) = parents
    assert client.get_run(parent).info.run_name == "swab" and json.loads((sweep.path / "mlflow.json").read_text())[
        "run_id"] == parent  # fmt: skip
    assert not (sweep.path / points[0].run_id / "mlruns").exists()


def test_doctor_and_export_given_a_sweep_address_its_points(tmp_path, capsys):
    """A sweep has no run of its own: `doctor SWEEP` diagnoses each failed point (the others in a
    line), `export SWEEP` is one line (exit 2) saying it is a sweep, the best point's run to
    export and every point's run. Two points as the worker leaves them (fixed content): point 0
    completed with evaluations, point 1 failed with a CUDA out-of-memory error on rank 1."""
    from tui_helpers import T0, make_run

    from clusterfsdp.control.sweepfolder import SweepFolder
    from clusterfsdp.core.records import Cause, Event, EventKind

    root = tmp_path / "runs"
    points = [SweepPoint(i, f"ab-p{i}", {"train.lr": lr}) for i, lr in enumerate((3e-3, 1e-3))]
    make_run(root, "ab-p0", name="tiny-swab", log_lines=0, checkpoints=(), eval_every=10)
    failed = make_run(root, "ab-p1", name="tiny-swab", end=None, logged=20, log_lines=0, checkpoints=())
    SweepFolder(root / "tiny-swab").write_record(SweepRecord("swab", "tiny", Executor.LOCAL, T0, ["train.lr"], points))
    reason = "rank 1 on node1: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    failed.append_event(Event(EventKind.FAILED, "1001", 0, 1, "node1", T0 + 60, step=20, reason=reason,
                              cause=Cause.ERROR, steps_done=20))  # fmt: skip
    assert main(["doctor", "swab", "--run-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "point 0  run ab-p0  train.lr=0.003  COMPLETED\n" in out and out.count("cause ") == 1, out
    assert "point 1  run ab-p1  train.lr=0.001  FAILED\n  cause      oom: OutOfMemoryError: CUDA out of memory" in out
    assert "  next       clusterfsdp resume ab-p1 --set train.micro_batch_size=N" in out
    assert main(["export", "swab", "--to", str(tmp_path / "out"), "--run-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: swab is a sweep of 2 points, not a run: export one "), err
    assert "the best, point 0 (eval_loss 2.8000): clusterfsdp export ab-p0 --to DIR" in err
    assert "its points: 0: ab-p0 (train.lr=0.003), 1: ab-p1 (train.lr=0.001)" in err
    assert not (tmp_path / "out").exists()


def test_status_sweep_sorts_points_by_a_benchmark_score_best_first(tmp_path, capsys):
    """`status SWEEP --sort bench/mc/acc` (or `mc/acc`): the points by their newest result's score,
    highest first, the point without a result last, the score in a column; a score lm-eval says
    is better lower (word_perplexity) lowest first; an unknown one is one line (exit 2) listing
    the known names; `--json` sorts the same way and names the score in `sorted_by`, each point's
    `benchmarks` holding its results."""
    from tui_helpers import scored_sweep

    root = tmp_path / "runs"
    scored_sweep(root)

    def points(*args: str) -> tuple[list[str], str]:
        assert main(["status", "swab", "--run-root", str(root), *args]) == 0
        out = capsys.readouterr().out
        table = out[out.index("POINT") :].splitlines()
        return [line.split()[0] for line in table[1:] if line[:1].isdigit()], table[0]

    order, head = points("--sort", "bench/mc/acc")
    assert order == ["1", "0", "2"] and head.split()[-2:] == ["mc/acc", "mc/word_perplexity"], head
    assert points("--sort", "mc/acc")[0] == ["1", "0", "2"]
    assert points("--sort", "bench/mc/word_perplexity")[0] == ["0", "1", "2"]
    assert points("--sort", "loss")[0] == ["0", "1", "2"]  # what status sorted by before still sorts
    assert main(["status", "swab", "--run-root", str(root), "--sort", "bench/mc/f1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: --sort bench/mc/f1: unknown; one of index, state, step, loss, eval_loss, train.lr, bench/mc/acc, "
        "bench/mc/acc_stderr, bench/mc/word_perplexity\n"
    )
    assert main(["status", "swab", "--run-root", str(root), "--sort", "mc/acc", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["sorted_by"] == "bench/mc/acc" and [p["index"] for p in doc["points"]] == [1, 0, 2]
    assert [[r["step"] for r in p["benchmarks"]] for p in doc["points"]] == [[40], [20, 40], []]
    assert doc["points"][0]["benchmarks"][-1]["bench/mc/acc"] == 0.75
