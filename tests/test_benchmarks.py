"""[benchmarks] (issue 38): lm-evaluation-harness on a run's checkpoints. Real: the checks run
through `clusterfsdp validate`; the evaluation is the real lm-eval on a checkpoint of a real
(one-process) training run, exported by the real export, compared with lm-eval's own CLI run by
hand on the same exported folder. Local task YAML over a local JSONL: nothing is downloaded."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import tiny_job_toml

from clusterfsdp.core import runfolder

ROWS = [
    ("The sun rises in the", "east", "west"),
    ("Water is", "wet", "dry"),
    ("One plus one is", "two", "five"),
    ("The sky is", "blue", "green"),
    ("Fire is", "hot", "cold"),
    ("Ice is", "cold", "hot"),
]
TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def write_task(folder: Path, data: str = "tiny_mc.jsonl", task: str = "tiny_mc") -> Path:
    """A multiple-choice task YAML in lm-eval's format over a JSONL beside it (`data` relative to it)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "tiny_mc.jsonl", "w") as f:
        for i, (question, right, wrong) in enumerate(ROWS):
            choices = [right, wrong] if i % 2 == 0 else [wrong, right]
            f.write(json.dumps({"question": question, "choices": [" " + c for c in choices], "answer": i % 2}) + "\n")
    path = folder / "tiny_mc.yaml"
    path.write_text(TASK_YAML.format(data=data, task=task))
    return path


def job_text(run_root: Path, tasks: list[str], extra: str = "") -> str:
    """procs' tiny job (4 steps), checkpoints at steps 2 and 4, [benchmarks] with `tasks` (5 examples)."""
    tail = (
        f"[checkpoint]\nevery_steps = 2\nkeep_last = 3\n[benchmarks]\ntasks = {json.dumps(tasks)}\nlimit = 5\n{extra}\n"
    )
    return tiny_job_toml("bench", 0, 4, tail=tail).replace("[job]\n", f'[job]\nrun_root = "{run_root}"\n', 1)


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clusterfsdp.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def test_benchmark_tasks_are_checked_before_queueing(tmp_path):
    """Every broken task is its own one-line error of `validate` (exit 2), none needs lm_eval's
    import: a local YAML that is missing, one whose data file is missing (relative to the YAML),
    a name the installed lm-eval does not ship (with the closest one), values out of range."""
    write_task(tmp_path / "tasks")
    write_task(tmp_path / "broken", data="gone.jsonl", task="tiny_broken")
    tasks = ["tasks/tiny_mc.yaml", "broken/tiny_mc.yaml", "missing.yaml", "hellaswag", "hellaswg"]
    job = tmp_path / "job.toml"
    job.write_text(job_text(tmp_path / "runs", tasks, 'batch_size = 0\ntime = "soon"\npartition = "a b"'))
    r = cli("validate", str(job), cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert any("benchmarks.batch_size: must be in [1, 4096], found 0" in e for e in errors), errors
    assert any("benchmarks.time:" in e for e in errors) and any("benchmarks.partition:" in e for e in errors)
    job.write_text(job_text(tmp_path / "runs", tasks))  # the values fixed: the files are checked next
    r = cli("validate", str(job), cwd=tmp_path)
    assert r.returncode == 2
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: benchmarks.tasks[1]: {tmp_path}/broken/tiny_mc.yaml: data file {tmp_path}/broken/gone.jsonl does "
        "not exist",
        f"error: benchmarks.tasks[2]: {tmp_path}/missing.yaml: no such task file",
        "error: benchmarks.tasks[4]: 'hellaswg' is no lm-eval task (did you mean 'hellaswag'?); name one or give "
        "a local task .yaml file",
    ], r.stderr
    job.write_text(job_text(tmp_path / "runs", ["tasks/tiny_mc.yaml", "hellaswag"]))
    r = cli("validate", str(job), cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_bench_scores_equal_lm_eval_run_by_hand_on_the_exported_checkpoint(tmp_path):
    """`clusterfsdp bench RUN --step 4` on a real 4-step run: benchmarks/step-4.json holds the same
    scores as lm-eval's own CLI run by hand (`lm_eval --include_path`, from the task's folder, so
    its relative data file resolves) on `clusterfsdp export` of that checkpoint, offline; the
    scores reach `status --json` and TensorBoard. A task whose data went missing fails in one line
    and is recorded."""
    from procs import run_workers

    from clusterfsdp.core import spec as S
    from clusterfsdp.core.records import Executor

    task = write_task(tmp_path / "tasks")
    job = tmp_path / "job.toml"
    job.write_text(
        job_text(tmp_path / "runs", ["tasks/tiny_mc.yaml"], 'every_checkpoints = 0\n[log]\ntrackers = ["tensorboard"]')
    )
    run = runfolder.create_run(S.load(job), Executor.LOCAL)
    run_workers(run, 1)

    scratch = tmp_path / "scratch"  # $TMPDIR: where the temporary export goes
    scratch.mkdir()
    r = cli("bench", str(run.path), "--step", "4", cwd=tmp_path, env={"TMPDIR": str(scratch)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("step 4: bench/tiny_mc/acc ")
    doc = json.loads((run.path / "benchmarks" / "step-4.json").read_text())
    assert doc["step"] == 4 and doc["lm_eval"]["results"]["tiny_mc"]["acc,none"] == doc["metrics"]["bench/tiny_mc/acc"]
    assert not list(scratch.glob("clusterfsdp-bench-*"))  # the temporary export removed (torch leaves its own)

    hf = tmp_path / "hf"
    assert cli("export", str(run.path), "--step", "4", "--to", str(hf), cwd=tmp_path).returncode == 0
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    by_hand = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={hf}", "--tasks", "tiny_mc",
         "--include_path", str(task.parent), "--limit", "5", "--device", "cpu", "--output_path", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        cwd=task.parent,
        env={**os.environ, **offline},
        timeout=600,
    )  # fmt: skip
    assert by_hand.returncode == 0, by_hand.stderr[-3000:]
    (result,) = (tmp_path / "o").rglob("results_*.json")
    expected = json.loads(result.read_text())["results"]["tiny_mc"]
    ours = doc["lm_eval"]["results"]["tiny_mc"]
    scores = ("acc,none", "acc_stderr,none", "acc_norm,none", "acc_norm_stderr,none")
    assert {k: ours[k] for k in scores} == {k: expected[k] for k in scores}
    assert doc["metrics"]["bench/tiny_mc/acc_norm"] == expected["acc_norm,none"]

    shown = cli("status", str(run.path), cwd=tmp_path).stdout
    assert f"benchmark  step 4: bench/tiny_mc/acc {expected['acc,none']:.4g}, bench/tiny_mc/acc_norm " in shown
    st = cli("status", str(run.path), "--json", cwd=tmp_path)
    (row,) = json.loads(st.stdout)["benchmarks"]
    assert row["step"] == 4 and row["bench/tiny_mc/acc"] == expected["acc,none"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    plots = EventAccumulator(str(run.path / "tensorboard" / "benchmarks"))
    plots.Reload()
    (point,) = plots.Scalars("bench/tiny_mc/acc")  # (float32 there)
    assert point.step == 4 and point.value == pytest.approx(expected["acc,none"], rel=1e-6)

    # `bench --all` beside an evaluation under way (here: step 2's lock held by this test, as the
    # run's own background evaluation holds it) waits for it instead of running it twice
    from clusterfsdp.core.lock import FileLock

    held = FileLock(run.path / "benchmarks" / "step-2.lock", "benchmarks of step 2").acquire()
    waiting = subprocess.Popen(
        [sys.executable, "-m", "clusterfsdp.cli", "bench", str(run.path), "--all"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env={**os.environ, "TMPDIR": str(scratch)},
    )  # fmt: skip
    assert waiting.stdout is not None
    first = waiting.stdout.readline()
    assert first.startswith("step 2: waiting for its evaluation under way (pid ") and "benchmarks of step 2" in first
    (run.path / "benchmarks" / "step-2.json").write_text(json.dumps({**doc, "step": 2}))  # it lands meanwhile
    held.release()
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0 and out == "step 2: evaluated meanwhile\n", out + err
    assert not list(scratch.glob("clusterfsdp-bench-*")) and not (run.path / "benchmarks" / "step-2.lock").exists()

    (task.parent / "tiny_mc.jsonl").unlink()
    r = cli("bench", str(run.path), "--step", "2", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: run {run.id}: benchmarks of step 2 failed: lm-eval: ")
    failed = json.loads((run.path / "benchmarks" / "step-2.failed.json").read_text())
    assert failed["step"] == 2 and failed["error"] in r.stderr


def _wait_for(results: Path, steps: list[int], timeout_s: float = 480) -> None:
    """Until each step's evaluation (run in the background) has ended: its step-N.json or
    step-N.failed.json is there, at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    ended = lambda step: (results / f"step-{step}.json").exists() or (results / f"step-{step}.failed.json").exists()
    while not all(ended(step) for step in steps):
        assert time.monotonic() < deadline, f"evaluations not ended after {timeout_s} s: {sorted(results.glob('*'))}"
        time.sleep(2)


def test_a_run_queues_its_evaluations_in_the_background_and_a_broken_one_never_fails_it(tmp_path):
    """Two real local runs (one rank, checkpoints at steps 2 and 4). The first evaluates each
    checkpoint in the background: its training completed before the step-4 evaluation did (it
    never waited), and with keep_last = 1 checkpoint 2 was still there for its evaluation (held
    from keep_last until exported). The second's task cannot load its split: training completes
    all the same, and `doctor` names the failed evaluations."""
    write_task(tmp_path / "tasks")
    broken = write_task(tmp_path / "broken", task="tiny_broken")
    broken.write_text(broken.read_text().replace("test_split: test", "test_split: validation"))
    runs = []
    for name in ("tasks", "broken"):
        job = tmp_path / f"{name}.toml"
        job.write_text(job_text(tmp_path / name, [f"{name}/tiny_mc.yaml"]))
        r = cli("submit", str(job), "--executor", "local", "--follow", "--set", "checkpoint.keep_last=1", cwd=tmp_path)
        assert r.returncode == 0 and ": COMPLETED" in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
        (run,) = runfolder.list_runs(tmp_path / name)
        runs.append(run)
    good, bad = runs
    results = good.path / "benchmarks"
    _wait_for(results, [2, 4])
    assert not list(results.glob("*.failed.json")), [p.read_text() for p in results.glob("*.failed.json")]
    st = json.loads(cli("status", str(good.path), "--json", cwd=tmp_path).stdout)
    assert [row["step"] for row in st["benchmarks"]] == [2, 4] and st["state"] == "COMPLETED"
    completed = [e["time"] for e in st["events"] if e["event"] == "completed"]
    assert completed and completed[0] < st["benchmarks"][1]["time"]  # training did not wait for step 4's
    assert not list(good.checkpoints_dir().glob(".bench-hold-*"))  # every hold released

    _wait_for(bad.path / "benchmarks", [2, 4])
    doc = cli("doctor", str(bad.path), cwd=tmp_path)
    assert doc.returncode == 0 and "benchmark  step 2 failed: lm-eval: " in doc.stdout, doc.stdout
    assert json.loads(cli("status", str(bad.path), "--json", cwd=tmp_path).stdout)["state"] == "COMPLETED"
    found = json.loads(cli("doctor", str(bad.path), "--json", cwd=tmp_path).stdout)
    assert [f["step"] for f in found["benchmarks_failed"]] == [2, 4]


@pytest.mark.slurm
def test_on_slurm_each_checkpoint_is_an_evaluation_job_on_the_benchmarks_partition(slurm_cluster, tmp_path):
    """The devcluster: a one-rank run on partition debug with benchmarks.partition = 'low'. Each
    checkpoint (steps 2 and 4) gets a Slurm job of its own, queued by submitit from rank 0, named
    for the run (singleton: they run in order), on 'low'; both score, and status --json has them."""
    write_task(tmp_path / "tasks")
    job = tmp_path / "job.toml"
    job.write_text(job_text(tmp_path / "runs", ["tasks/tiny_mc.yaml"], 'partition = "low"\ntime = "10"'))
    r = cli("submit", str(job), "--executor", "slurm", "--follow", "--set", "slurm.time=10", cwd=tmp_path)
    assert r.returncode == 0 and ": COMPLETED" in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    (run,) = runfolder.list_runs(tmp_path / "runs")
    assert "[benchmarks]: evaluating step 2: job " in r.stdout, r.stdout[-3000:]
    results = run.path / "benchmarks"
    _wait_for(results, [2, 4])
    assert not list(results.glob("*.failed.json")), [p.read_text() for p in results.glob("*.failed.json")]
    jobs = re.findall(r"\[benchmarks\]: evaluating step \d+: job (\d+) on low", r.stdout)
    assert len(jobs) == 2, r.stdout[-3000:]
    for job_id in jobs:
        slurm_cluster.wait_sacct(job_id, "COMPLETED", timeout=60)
        listed = slurm_cluster.run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "JobName,Partition"]).stdout
        assert listed.split() == [f"bench-{run.id}|low"]
    st = json.loads(cli("status", str(run.path), "--json", cwd=tmp_path).stdout)
    assert [row["step"] for row in st["benchmarks"]] == [2, 4]
    assert not list(run.checkpoints_dir().glob(".bench-hold-*"))
