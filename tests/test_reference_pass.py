"""The reference pass of dpo/ipo (issue 37 item 2): train.preference.reference_pass,
reference_model and reference_partition.

Refusals are checked by `validate` and `submit` before anything is made (one line, exit 2). A
reference model other than the starting one is real: two gloo ranks on CPU train a full
fine-tune of one saved Llama against another (reference_pass 'in_job': the training job builds
the reference, computes the tables and frees it before the first step); its table and the first
step's loss are checked against log-probs computed with plain transformers. The Slurm reference
job itself is tests/test_slurm_reference.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from data_helpers import write_jsonl
from procs import run_workers
from test_preference import _job, _pair_run, _word_pairs

from clusterfsdp import cli
from clusterfsdp.core import ckptfolder
from clusterfsdp.core import spec as S
from clusterfsdp.data.rankdata import open_for_training
from clusterfsdp.worker import preference


def test_reference_keys_where_no_reference_pass_runs_are_refused(tmp_path, capsys):
    """Each new key refused with one line where it would be silently ignored, and 'job' where no
    Slurm job can be queued (the local executor)."""
    write_jsonl(tmp_path / "pairs.jsonl", _word_pairs(4, seed=1))
    job = _job(tmp_path, 'paths = ["pairs.jsonl"]\ntokenizer = "bytes"')
    refusals = {
        "train.objective=simpo train.preference.reference_pass=job": (
            "train.preference.reference_pass: train.objective 'simpo' compares with no reference model (only 'dpo' "
            "and 'ipo' do); remove it"
        ),
        "train.objective=orpo train.preference.reference_model=/x": "train.preference.reference_model: train.obj",
        "train.preference.reference_partition=gpu peft.method=lora model.name_or_path=/x model.preset=''": (
            "train.preference.reference_partition: with [peft] LoRA the reference is the base with the adapters "
            "disabled (no reference pass); remove it"
        ),
        "train.preference.reference_pass=in_job train.preference.reference_partition=gpu": (
            "train.preference.reference_partition: reference_pass = 'in_job' queues no reference job; remove it"
        ),
        "train.preference.reference_partition=a;b": "train.preference.reference_partition:",
        f"train.preference.reference_model={tmp_path / 'none'}": (
            f"train.preference.reference_model: '{tmp_path / 'none'}': no such folder"
        ),
        "train.preference.reference_model=./pairs.jsonl": (  # relative to the job file, like model.name_or_path
            f"train.preference.reference_model: '{tmp_path / 'pairs.jsonl'}': no such folder"
        ),
    }
    for sets, line in refusals.items():
        args = [a for kv in sets.split() for a in ("--set", kv)]
        assert cli.main(["validate", str(job), *args]) == 2, sets
        err = capsys.readouterr().err
        assert line in err, (sets, err)
    step = tmp_path / "ckpt"  # a clusterfsdp checkpoint is not a HuggingFace folder
    step.mkdir()
    (step / ckptfolder.COMPLETE).write_text("{}")
    assert cli.main(["validate", str(job), "--set", f"train.preference.reference_model={step}"]) == 2
    assert f"train.preference.reference_model: {step} is a clusterfsdp checkpoint (DCP shards); export it" in (
        capsys.readouterr().err
    )
    sets = ["--set", "train.preference.reference_pass=job"]
    assert cli.main(["submit", str(job), "--executor", "local", *sets]) == 2
    assert "train.preference.reference_pass: 'job' is a Slurm job of its own and this run uses the local executor; " \
        "set it to 'in_job'" in capsys.readouterr().err  # fmt: skip
    assert cli.main(["submit", str(job), "--dry-run", *sets]) == 2
    assert "train.preference.reference_pass: 'job' is a Slurm job of its own, which `submit --dry-run` does not " \
        "write; set it to 'in_job'" in capsys.readouterr().err  # fmt: skip
    grid = ["--grid", "train.lr=1e-3,2e-3"]
    assert cli.main(["sweep", str(job), *grid, "--executor", "local", *sets]) == 2
    assert "train.preference.reference_pass: 'job' is not queued for a sweep's points" in capsys.readouterr().err
    assert not [p for p in tmp_path.iterdir() if p.is_dir() and p.name not in ("ckpt", "cache")]  # no run folder


def _saved_llama(folder: Path, seed: int) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    from clusterfsdp.core.presets import PRESETS

    torch.manual_seed(seed)
    keys = {k: v for k, v in PRESETS["llama-tiny"].items() if k != "model_type"}
    AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **keys)).save_pretrained(folder)
    return folder


def test_a_reference_model_other_than_the_starting_one(tmp_path):
    """A full fine-tune of Llama A (2 ranks, FSDP2) with train.preference.reference_model =
    Llama B, in the training job: the kept table is B's log-probs of every pair, and the first
    step (all the pairs in one global batch) has the loss of A against B, not log 2."""
    policy, reference = _saved_llama(tmp_path / "a", 1), _saved_llama(tmp_path / "b", 2)
    run = _pair_run(
        tmp_path, "dpo", "", "[slurm]\ntasks_per_node = 2\n", f"model.name_or_path={str(policy)!r}",
        "model.preset=''", f"train.preference.reference_model={str(reference)!r}", "train.steps=1",
        "train.micro_batch_size=48", "eval.fraction=0",
    )  # fmt: skip
    out = run_workers(run, 2, job_id="r1")
    said = out[0][1]
    assert f"reference log-probs of the train pairs: 96 computed by the reference model {reference}" in said, said
    spec = S.load(run.job_toml)
    train = open_for_training(spec, 0, print).train
    assert train is not None and train.count == 96
    batch = preference.read_pairs(train, preference.all_pair_ids(train))
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        logps = {
            name: preference.sequence_logps(AutoModelForCausalLM.from_pretrained(path).eval(), batch)[0].double()
            for name, path in (("policy", policy), ("reference", reference))
        }
    table = preference.ReferenceTable.load(ckptfolder.reference_file(run.checkpoints_dir(), "train"))
    expected = logps["reference"].view(2, -1).T.numpy()  # (chosen, rejected) by pair id
    assert np.allclose(table.logps, expected, rtol=1e-5, atol=1e-4)
    pc, pr = logps["policy"].chunk(2)
    rc, rr = logps["reference"].chunk(2)
    beta = spec.train.preference.beta
    loss = float(-torch.nn.functional.logsigmoid(beta * ((pc - rc) - (pr - rr))).mean())
    first = next(r for r in run.metrics() if r.get("step") == 1)["loss"]
    assert abs(first - math.log(2)) > 1e-3
    assert first == pytest.approx(loss, rel=1e-5, abs=1e-5)
