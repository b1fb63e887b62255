"""[benchmarks] (issue 38): lm-evaluation-harness on a run's checkpoints. Real: the checks run
through `clusterfsdp validate`; the evaluation is the real lm-eval on a checkpoint of a real
(one-process) training run, exported by the real export, compared with lm-eval's own CLI run by
hand on the same exported folder. Local task YAML over a local JSONL: nothing is downloaded."""

from __future__ import annotations

import json
import os
import re
import shutil
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


def test_task_code_of_another_user_and_hub_data_not_cached_are_refused_before_queueing(
    tmp_path, other_user, shared_root
):
    """lm-eval imports the Python a task YAML names (`!function utils.fn`: utils.py beside it), so
    a task file of another user, or your task file naming their code, is refused by `validate`
    (one line naming the file); so is a `dataset_path` that is a hub dataset id not in the local
    datasets cache (evaluations run offline), until the cache has it."""
    theirs = other_user.plant_copy(write_task(tmp_path / "theirs").parent, shared_root)
    other_user.plant(shared_root, {"mixed/utils.py": b"def process_docs(docs):\n    return docs\n"})
    mixed = write_task(shared_root / "mixed", task="tiny_mixed")
    mixed.write_text(mixed.read_text() + "process_docs: !function utils.process_docs\n")
    hub = write_task(tmp_path / "hub", task="tiny_hub")
    hub.write_text(hub.read_text().replace("dataset_path: json", "dataset_path: someorg/tiny_mc_data"))
    hub.write_text(re.sub(r"dataset_kwargs:\n  data_files:\n    test: .*\n", "", hub.read_text()))
    job = tmp_path / "job.toml"
    job.write_text(job_text(tmp_path / "runs", [str(theirs / "tiny_mc.yaml"), str(mixed), "hub/tiny_mc.yaml"]))
    cache = {"HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": "", "HF_HUB_CACHE": ""}
    r = cli("validate", str(job), cwd=tmp_path, env=cache)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    owner = f"belongs to {other_user.name} (uid {other_user.uid}), not to you or the trusted group"
    assert errors == [
        f"error: benchmarks.tasks[0]: {theirs}/tiny_mc.yaml {owner} ($CLUSTERFSDP_TRUSTED_GROUP): refusing to load "
        "it as an lm-eval task file (lm-eval would run its code as you); copy it into a folder of yours",
        f"error: benchmarks.tasks[1]: {mixed.parent}/utils.py {owner} ($CLUSTERFSDP_TRUSTED_GROUP): refusing to "
        f"load it as the code of {mixed}'s !function utils.process_docs (lm-eval would run its code as you); copy "
        "it into a folder of yours",
        f"error: benchmarks.tasks[2]: {hub}: dataset_path 'someorg/tiny_mc_data' is a Hugging Face hub dataset that "
        "is not in the local cache, and evaluations run offline: set dataset_path to json, csv or parquet with "
        "dataset_kwargs.data_files (local files), or download it into the cache first",
    ], r.stderr
    (tmp_path / "hf" / "datasets" / "someorg___tiny_mc_data").mkdir(parents=True)  # datasets' own cache layout
    r = cli("validate", str(job), cwd=tmp_path, env=cache)
    assert [line for line in r.stderr.splitlines() if line.startswith("error:")] == errors[:2], r.stderr


def test_keep_best_and_early_stopping_on_a_benchmark_score_are_checked(tmp_path):
    """`checkpoint.keep_best` / `train.early_stopping.metric` = 'bench/<task>/<metric>': the task
    must be one of [benchmarks].tasks (a local YAML's `task:` name), the metric one whose direction
    is known; early stopping needs the run to evaluate its checkpoints itself. One line each."""
    write_task(tmp_path / "tasks")
    job = tmp_path / "job.toml"
    job.write_text(job_text(tmp_path / "runs", ["tasks/tiny_mc.yaml"]))
    cases = {
        "checkpoint.keep_best=bench/tiny_mc/acc_norm": None,
        "train.early_stopping.metric=bench/tiny_mc/acc": None,
        "checkpoint.keep_best=bench/tiny_other/acc": "checkpoint.keep_best: 'bench/tiny_other/acc' names task "
        "'tiny_other', which is not in benchmarks.tasks (its tasks: tiny_mc)",
        "checkpoint.keep_best=bench/tiny_mc/acc_stderr": "checkpoint.keep_best: cannot tell whether a higher or a "
        "lower 'acc_stderr' is better (known lm-eval metrics: ",
        "checkpoint.keep_best=bench/tiny_mc": "checkpoint.keep_best: 'bench/tiny_mc' is no benchmark score; write "
        "'bench/<task>/<metric>'",
        "train.early_stopping.metric=bench/tiny_mc/acc benchmarks.every_checkpoints=0": "train.early_stopping.metric: "
        "'bench/tiny_mc/acc' needs the run to evaluate its checkpoints as it saves them",
        "checkpoint.keep_best=eval_los": "checkpoint.keep_best: expected one of '', 'eval_loss', "
        "'eval_reward_accuracy' or 'bench/<task>/<metric>', found 'eval_los' (did you mean 'eval_loss'?)",
    }
    for sets, expected in cases.items():
        r = cli("validate", str(job), *(a for s in sets.split() for a in ("--set", s)), cwd=tmp_path)
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        if expected is None:
            assert r.returncode == 0, (sets, r.stderr)
        else:
            assert r.returncode == 2 and len(errors) == 1 and expected in errors[0], (sets, r.stderr)


def test_local_tasks_are_built_without_indexing_lm_evals_own_tasks(tmp_path, monkeypatch):
    """An evaluation of local task files only skips lm-eval's index of its ~15,000 default task
    files (5-7 s of CPU per evaluation); a task name, or a local group (whose members are names),
    keeps it. The scores are lm-eval's by hand either way: the test below compares them."""
    from lm_eval.tasks._yaml_loader import load_yaml

    from clusterfsdp.worker import bench

    local = load_yaml(write_task(tmp_path / "tasks"))
    monkeypatch.chdir(tmp_path / "tasks")  # (its data file is relative; bench.task_configs makes it absolute)
    group = {"group": "mine", "task": ["hellaswag", "tiny_mc"]}
    assert not bench.needs_task_index([local])
    assert bench.needs_task_index([local, "hellaswag"]) and bench.needs_task_index([group])
    manager = bench.task_manager([local], "pretrained=/some/model")
    assert manager.all_tasks == [] and manager.load([local])["tasks"].keys() == {"tiny_mc"}


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
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(scratch)},
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

    # the export, in the evaluation's own process (worker/bench.py --export), fails as the
    # export's: its one line, recorded; the temporary folder removed
    from clusterfsdp.core import ckptfolder

    checkpoint = ckptfolder.find(run.checkpoints_dir(), 2)
    assert checkpoint is not None
    for shard in checkpoint.path.glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:100])
    r = cli("bench", str(run.path), "--step", "2", cwd=tmp_path, env={"TMPDIR": str(scratch)})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(
        f"error: run {run.id}: benchmarks of step 2 failed: export: error: exporting step 2 of run {run.id} failed: "
    ), r.stderr
    failed = json.loads((run.path / "benchmarks" / "step-2.failed.json").read_text())
    assert failed["error"] in r.stderr and not list(scratch.glob("clusterfsdp-bench-*"))


def test_bench_sweep_evaluates_each_point_and_reports_one_without_a_checkpoint(tmp_path):
    """`bench SWEEP --step 4` on a sweep laid out as control.sweep leaves it, from ONE real 4-step
    run (trained once, copied as points 0 and 1; point 2 as prepared, no checkpoint): each trained
    point gets its step-4.json (the same scores: the same weights), point 2 is a line saying it
    has no checkpoint and the others go on (exit 0); then `status SWEEP --sort tiny_mc/acc --json`
    sorts by the real scores, point 2 last. A sweep with --step and --all is one line, exit 2."""
    import shutil

    from procs import run_workers

    from clusterfsdp.control.sweepfolder import SweepFolder
    from clusterfsdp.core import spec as S
    from clusterfsdp.core.records import Executor, SweepPoint, SweepRecord

    write_task(tmp_path / "tasks")
    job = tmp_path / "job.toml"
    job.write_text(job_text(tmp_path / "runs", ["tasks/tiny_mc.yaml"], "every_checkpoints = 0"))
    run = runfolder.create_run(S.load(job), Executor.LOCAL)
    run_workers(run, 1)
    sweep = SweepFolder(tmp_path / "runs" / "bench-swab")
    points = [SweepPoint(i, f"ab-p{i}", {"train.lr": lr}) for i, lr in enumerate((3e-3, 1e-3, 2e-3))]
    for p in points:
        ignore = shutil.ignore_patterns("checkpoints") if p.index == 2 else None
        shutil.copytree(run.path, sweep.path / p.run_id, ignore=ignore)
    sweep.write_record(SweepRecord("swab", "bench", Executor.LOCAL, time.time(), ["train.lr"], points))

    r = cli("bench", str(sweep.path), "--step", "4", "--all", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr == "error: bench: give --step or --all, not both\n", r.stderr
    r = cli("bench", str(sweep.path), "--step", "4", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("point 0 (train.lr=0.003) run ab-p0: step 4: bench/tiny_mc/acc "), lines
    assert lines[1].startswith("point 1 (train.lr=0.001) run ab-p1: step 4: bench/tiny_mc/acc "), lines
    assert lines[2:] == [
        "point 2 (train.lr=0.002) run ab-p2: skipped: run ab-p2: no complete checkpoint at step 4",
        "sweep swab: 2 evaluated, 0 failed, 1 point(s) skipped",
    ]
    docs = [json.loads((sweep.path / f"ab-p{i}" / "benchmarks" / "step-4.json").read_text()) for i in (0, 1)]
    assert docs[0]["metrics"] == docs[1]["metrics"] and "bench/tiny_mc/acc" in docs[0]["metrics"]
    st = cli("status", str(sweep.path), "--sort", "tiny_mc/acc", "--json", cwd=tmp_path)
    doc = json.loads(st.stdout)
    assert doc["sorted_by"] == "bench/tiny_mc/acc" and [p["index"] for p in doc["points"]] == [0, 1, 2]
    assert [[row["step"] for row in p["benchmarks"]] for p in doc["points"]] == [[4], [4], []]


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
    for the run (singleton: they run in order), on 'low', queued by a process training does not wait
    for; both score, and status --json and TensorBoard have them."""
    write_task(tmp_path / "tasks")
    job = tmp_path / "job.toml"
    tensorboard = '\n[log]\ntrackers = ["tensorboard"]'
    job.write_text(job_text(tmp_path / "runs", ["tasks/tiny_mc.yaml"], 'partition = "low"\ntime = "10"' + tensorboard))
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
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    plots = EventAccumulator(str(run.path / "tensorboard" / "benchmarks"))
    plots.Reload()
    points = plots.Scalars("bench/tiny_mc/acc")
    assert [p.step for p in points] == [2, 4], points
    assert [p.value for p in points] == pytest.approx([row["bench/tiny_mc/acc"] for row in st["benchmarks"]], rel=1e-6)


PPL_YAML = """task: tiny_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: tiny_ppl.jsonl
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""
PPL = "bench/tiny_ppl/word_perplexity"


def write_ppl_task(folder: Path) -> Path:
    """A perplexity task (lm-eval's loglikelihood_rolling) over paragraphs of the training corpus:
    a continuous score that differs from checkpoint to checkpoint (lower is better)."""
    from procs import CORPUS

    folder.mkdir(parents=True, exist_ok=True)
    paragraphs = [p.strip() for p in CORPUS.read_text().split("\n\n") if p.strip()][:3]
    (folder / "tiny_ppl.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs))
    path = folder / "tiny_ppl.yaml"
    path.write_text(PPL_YAML)
    return path


def test_keep_best_on_a_benchmark_score_decides_as_results_land_and_export_best_picks_it(tmp_path, monkeypatch):
    """A real one-rank run (checkpoints 2 and 4, keep_last = 1) with keep_best on a perplexity
    score, evaluated in the background as it saves, W&B (offline) and MLflow (file store) on.
    Once both results landed: `.bench-best.json` names the step with the lower recorded score,
    `export --best` exports that one, keep_last would let go of the other (not the newest) only if
    it is not the best, no hold is left; the scores are in MLflow's run and in W&B's
    `<run>-benchmarks` run at their steps. Then a second, one-step run on the same landed results
    with early stopping on the score (min_delta so large that the second result cannot improve):
    its trainer reads them at its first agreement point and ends COMPLETED with the reason."""
    from procs import make_run, run_workers
    from test_trackers import _wandb_records

    from clusterfsdp.core import ckptfolder

    for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_ALLOW_FILE_STORE": "true"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    task = write_ppl_task(tmp_path / "tasks")
    extra = '[log]\ntrackers = ["wandb", "mlflow"]\nproject = "proj"\n'
    job = job_text(tmp_path / "runs", [str(task)], extra).replace(
        "keep_last = 3", f'keep_last = 1\nkeep_best = "{PPL}"'
    )
    run = make_run(job, tmp_path / "runs")
    run_workers(run, 1)
    results = run.path / "benchmarks"
    _wait_for(results, [2, 4])
    assert not list(results.glob("*.failed.json")), [p.read_text() for p in results.glob("*.failed.json")]
    scores = {s: json.loads((results / f"step-{s}.json").read_text())["metrics"][PPL] for s in (2, 4)}
    assert scores[2] != scores[4], scores
    best = min(scores, key=lambda s: scores[s])
    root = run.checkpoints_dir()
    deadline = time.monotonic() + 60  # the step-4 result is written before its process records the best
    while ckptfolder.held_steps(root) and time.monotonic() < deadline:
        time.sleep(1)
    assert not ckptfolder.held_steps(root)
    record = json.loads((root / ".bench-best.json").read_text())
    assert record == {"metric": PPL, "step": best, "value": scores[best]}
    assert [p.name for p in ckptfolder.beyond_keep(root, 1, PPL)] == ([] if best == 2 else ["step-00000002"])
    r = cli("export", str(run.path), "--best", "--to", str(tmp_path / "best"), cwd=tmp_path)
    assert r.returncode == 0 and f"exported step {best} to " in r.stdout, r.stdout + r.stderr

    from mlflow.tracking import MlflowClient

    ids = json.loads(run.trackers_file.read_text())
    client = MlflowClient(tracking_uri=(run.path / "mlruns").as_uri())
    history = client.get_metric_history(ids["mlflow_run_id"], PPL)
    assert sorted((m.step, m.value) for m in history) == [(s, pytest.approx(scores[s])) for s in (2, 4)]
    logs = sorted((run.path / "wandb").glob(f"offline-run-*/run-{ids['wandb_run_id']}-bench.wandb"))
    assert len(logs) == 2, sorted((run.path / "wandb").rglob("*.wandb"))
    logged = []
    for path in logs:
        for rec in _wandb_records(str(path)):
            if rec.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
                logged.append((items["train/step"], items[PPL]))
    assert sorted(logged) == [(s, pytest.approx(scores[s])) for s in (2, 4)]

    bits = "bench/tiny_ppl/bits_per_byte"  # (a few bits: a min_delta of 100 is more than any change)
    stop = "train.early_stopping={ metric = '" + bits + "', patience = 1, min_delta = 100.0 }"
    again = make_run(job, tmp_path / "again", ["benchmarks.every_checkpoints=2", "log.trackers=[]", stop])
    shutil.copytree(results, again.path / "benchmarks", ignore=shutil.ignore_patterns("*.log", "slurm"))
    out = run_workers(again, 1)
    assert f"early stopping at step 1: {bits} has not improved by more than 100 on its best " in out[0][1], out[0][1]
    completed = [e for e in again.events() if e.event.value == "completed"]
    assert completed and completed[-1].reason.startswith("early stopping at step 1") and completed[-1].step == 1
