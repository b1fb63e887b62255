"""train.epochs (issue 23.1): the step count derived from the prepared training set and the
global batch, for concat and documents packing, on real prepared data and real multi-process
runs; kept across a resume on another world size; `epoch` in every metrics row, in `status` and
in `validate`. checkpoint.keep_best and train.early_stopping (issue 23.5) on real tiny runs."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from data_helpers import documents, write_jsonl
from procs import make_run, run_workers, tiny_job_toml

from clusterfsdp.control import jsonout, status
from clusterfsdp.control.run import Run
from clusterfsdp.core import ckptfolder
from clusterfsdp.core import spec as S
from clusterfsdp.core.errors import UserError
from clusterfsdp.core.records import EventKind, Executor, RunState
from clusterfsdp.data import cache, checks, samplesets

JOB = tiny_job_toml(
    "ep",
    seed=3,
    steps=0,
    fsdp='sharding = "full"',
    tail="""
[slurm]
tasks_per_node = 2
[checkpoint]
every_steps = 2
keep_last = 5
""",
)


def _epochs_job(epochs: float) -> str:
    return JOB.replace("steps = 0\n", f"epochs = {epochs}\n")


def _train_samples(spec: S.JobSpec) -> int:
    """The training set's size, from the sample index the job built (its meta.json)."""
    ref = cache.dataset_refs(spec)[0]
    meta = samplesets.index_meta(ref, spec, "train")
    assert meta is not None, "the job built no sample index"
    return int(meta["samples"])


def test_steps_and_epochs_together_are_one_error_and_epochs_round_trip():
    with pytest.raises(S.SpecError) as e:
        S.loads(JOB.replace("steps = 0\n", "steps = 10\nepochs = 1.5\n"))
    assert e.value.errors == [
        "train.steps and train.epochs: give one of them (train.epochs derives the steps from the data)"
    ]
    spec = S.loads(_epochs_job(1.5))
    assert (spec.train.steps, spec.train.epochs) == (0, 1.5)
    assert S.loads(S.dumps(spec)).train.epochs == 1.5  # the run folder's job.toml loads again
    with pytest.raises(S.SpecError, match=r"train\.epochs: needs data from files"):
        S.loads(_epochs_job(1).replace('source = "files"', 'source = "synthetic"'))
    with pytest.raises(S.SpecError, match=r"train\.steps: must be >= 1, found 0"):
        S.loads(JOB)  # neither: steps 0 without epochs


def test_the_step_count_and_the_passes_note():
    spec = S.loads(_epochs_job(0.25))  # 2 ranks x 2 x 1 = global batch 4
    assert samplesets.total_steps(spec, 190) == 12  # round(47.5) = 48 samples -> 12 steps
    assert samplesets.total_steps(spec, 191) == 12  # round(47.75) = 48
    assert samplesets.total_steps(spec, 200) == 13  # 50 samples: the last step passes the end
    # from a checkpoint: the rest divided by today's global batch
    assert samplesets.total_steps(spec, 190, step=4, consumed=16) == 12
    narrow = S.loads(_epochs_job(0.25), ["slurm.tasks_per_node=1"])  # global batch 2
    assert samplesets.total_steps(narrow, 190, step=4, consumed=16) == 4 + 16
    steps = S.loads(JOB.replace("steps = 0", "steps = 100"))
    assert samplesets.epochs_note(steps, 190, 40) is None  # 160 samples: less than one pass
    assert samplesets.epochs_note(steps, 190, 100) == (
        "100 steps = 2.1 passes over the data (190 training samples, global batch 4 = 2 ranks x 2 x 1 accumulation)"
    )


def test_epochs_count_the_steps_of_concat_windows(tmp_path):
    """1 run on 2 ranks: the steps are epochs x the concat windows of the prepared corpus over
    the global batch, every metrics row has its epoch, status and validate say it."""
    run = make_run(_epochs_job(0.1), tmp_path)
    out = run_workers(run, 2)
    spec = S.load(run.job_toml)
    manifest = cache.dataset_refs(spec)[0].manifest()
    assert manifest is not None
    windows = (int(manifest["tokens"]) - 1) // 64  # concat: windows of seq_len + 1 tokens, one shared
    assert _train_samples(spec) == windows
    expected = math.ceil(round(0.1 * windows) / 4)
    rows = run.metrics()
    assert [r["step"] for r in rows] == list(range(1, expected + 1))
    assert all(r["epoch"] == pytest.approx(r["step"] * 4 / windows) for r in rows)
    assert all(r["total_steps"] == expected for r in rows)
    assert f"train.epochs = 0.1: {expected} steps ({windows:,} training samples" in out[0][1]
    st = status.run_status(run)
    assert (st.step, st.steps, st.epoch) == (expected, expected, pytest.approx(expected * 4 / windows))
    assert '"epoch": ' in jsonout.document(st)
    assert f"train: train.epochs = 0.1: {expected} steps" in "\n".join(checks.prepared_state(spec))


def test_epochs_with_documents_packing_survive_a_resume_on_another_world_size(tmp_path):
    """Documents packing: the step count from the packed sample index; a resume on 1 rank with
    the same global batch (micro-batch 4) keeps it, one with a smaller global batch (micro-batch
    2) ends after the same number of samples, with more steps, and says so."""
    path = write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in documents(30)])
    run = make_run(_epochs_job(0.3), tmp_path, [f"data.paths=['{path}']", "data.packing='documents'"])
    run_workers(run, 2, job_id="d1")
    spec = S.load(run.job_toml)
    samples = _train_samples(spec)
    expected = math.ceil(round(0.3 * samples) / 4)
    assert expected >= 4, samples  # a resume from step 2 has steps left
    assert max(r["step"] for r in run.metrics()) == expected

    ckptfolder.keep_only_up_to(run.checkpoints_dir(), 2)
    run.job_toml.write_text(S.dumps(S.load(run.job_toml, ["slurm.tasks_per_node=1", "train.micro_batch_size=4"])))
    run_workers(run, 1, job_id="d2")
    final = ckptfolder.find(run.checkpoints_dir())
    assert final is not None and final.step == expected and final.meta["world_size"] == 1

    ckptfolder.keep_only_up_to(run.checkpoints_dir(), 2)
    run.job_toml.write_text(S.dumps(S.load(run.job_toml, ["train.micro_batch_size=2"])))  # global batch 2
    out = run_workers(run, 1, job_id="d3")
    longer = 2 + math.ceil((round(0.3 * samples) - 8) / 2)
    final = ckptfolder.find(run.checkpoints_dir())
    assert final is not None and final.step == longer > expected
    assert f"train.epochs: {longer} steps now, the checkpoint planned {expected}" in out[0][1]
    last = run.metrics()[-1]
    assert last["epoch"] == pytest.approx((8 + (longer - 2) * 2) / samples)


# ---------------------------------------------------------------- keep-best and early stopping (issue 23.5)
EVAL = ["eval.fraction=0.2", "eval.every_steps=2", "eval.batches=2", "checkpoint.every_steps=0"]


def test_keep_best_keeps_the_lowest_eval_loss_past_keep_last_and_export_best_picks_it(tmp_path):
    """4 steps at lr 3e-3, then the run extended to 8 steps at lr 0.9, which makes the loss
    diverge: the lowest eval loss is at step 4; with keep_last = 1 that checkpoint is kept beside
    the final one, every checkpoint's clusterfsdp.json names it, and `export --best` picks it."""
    run = make_run(
        JOB.replace("steps = 0", "steps = 4"),
        tmp_path / "runs",
        [*EVAL, "checkpoint.keep_last=1", "checkpoint.keep_best='eval_loss'"],
    )
    run_workers(run, 2, job_id="b1")
    run.job_toml.write_text(S.dumps(S.load(run.job_toml, ["train.steps=8", "train.lr=0.9"])))
    run_workers(run, 2, job_id="b2")
    evals = {r["step"]: r["eval_loss"] for r in run.metrics() if "eval_loss" in r}
    assert sorted(evals) == [2, 4, 6, 8]
    best = min(evals, key=lambda s: evals[s])
    assert best < 8, evals  # the scenario: the best is not the newest
    kept = ckptfolder.list_checkpoints(run.checkpoints_dir())
    assert [c.step for c in kept] == [best, 8]
    assert kept[-1].meta[ckptfolder.BEST_STEP] == best and kept[-1].meta["best_eval_loss"] == evals[best]
    assert ckptfolder.best(run.checkpoints_dir()) == kept[0]
    r = subprocess.run(
        [sys.executable, "-m", "clusterfsdp", "export", run.id, "--best", "--to", str(tmp_path / "hf"),
         "--run-root", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0 and f"exported step {best} to " in r.stdout, r.stdout + r.stderr
    assert (tmp_path / "hf" / "config.json").is_file()
    with pytest.raises(UserError, match=r"--best needs checkpoint\.keep_best"):
        Run(make_run(JOB.replace("steps = 0", "steps = 8"), tmp_path / "other", EVAL)).export_command(
            tmp_path / "hf", best=True
        )


def test_early_stopping_ends_the_run_completed_with_its_reason(tmp_path):
    """lr 1e-12 cannot move the eval loss by min_delta 0.01: the evaluation at step 2 sets the
    best, those at 4 and 6 do not improve on it, so patience 2 stops the run at step 6 of 20,
    saved, COMPLETED, with the reason in the completed event and in `status`."""
    run = make_run(
        JOB.replace("steps = 0", "steps = 20").replace("lr = 3e-3", "lr = 1e-12"),
        tmp_path,
        [*EVAL, "train.early_stopping={ metric = 'eval_loss', patience = 2, min_delta = 0.01 }"],
    )
    run.add_attempt("t1", Executor.LOCAL, "submit")  # as `submit` records it, for `status`
    out = run_workers(run, 2, job_id="t1")
    assert max(r["step"] for r in run.metrics()) == 6
    assert [c.step for c in ckptfolder.list_checkpoints(run.checkpoints_dir())] == [6]
    done = [e for e in run.events() if e.event is EventKind.COMPLETED]
    assert len(done) == 1 and done[0].step == 6
    reason = done[0].reason
    assert reason.startswith("early stopping at step 6: eval_loss has not improved by more than 0.01") and (
        "at step 2) for 2 evaluation(s)" in reason
    )
    assert reason in out[0][1]
    st = status.run_status(run)
    assert st.state is RunState.COMPLETED and st.reason == reason
