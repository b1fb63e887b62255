"""The reference pass of a DPO run as a Slurm job of its own (control/refjob.py,
worker/reference.py), through the real daemons of the local test cluster: `submit` queues the
data prepare array, then `<name>-reference` after it, then the training job after both; the
training job reads the tables (its first loss is log 2: the reference is the starting model)
and completes. That run is HSDP over the cluster's two nodes (2 x 2 ranks: a replica per node), so the
reference job and the training job each span both. A reference model whose vocabulary does not
fit the data fails the reference job: the training job never starts, and `status` and `doctor`
name the reference job and its error. `cancel` of a run waiting for its reference job cancels
that job too."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from data_helpers import write_jsonl
from test_preference import _word_pairs
from test_slurm_prepare import cli, wait_for

from clusterfsdp.control import doctor, status
from clusterfsdp.core import runfolder

pytestmark = pytest.mark.slurm(cluster="b")  # the second devcluster's half (tests/slurm_fixtures.py)


def _sacct(cluster, job_id: str) -> dict[str, str]:
    out = cluster.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobName,State,Start,End"]).stdout
    name, state, start, end = out.strip().splitlines()[-1].split("|")
    return {"name": name, "state": state, "start": start, "end": end}


def _small_vocab_llama(folder: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(
        LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=2)
    ).save_pretrained(folder)  # fmt: skip
    return folder


def test_the_reference_pass_is_its_own_slurm_job_before_training(slurm_cluster, tiny_job, tmp_path):
    root = tmp_path / "runs"
    pairs = write_jsonl(tmp_path / "pairs.jsonl", _word_pairs(64, seed=3))
    sets = [
        f"data.paths=['{pairs}']", "data.format=preference", "data.seq_len=32", "data.prepare_workers=1",
        "train.objective=dpo", "train.steps=2", "train.warmup=0", "train.log_every=1", "train.micro_batch_size=4",
        "eval.fraction=0.25",
    ]  # fmt: skip
    args = [a for kv in sets for a in ("--set", kv)]
    hsdp = ["--set", "slurm.nodes=2", "--set", "fsdp.sharding=hybrid"]
    r = cli("submit", str(tiny_job), "--executor", "slurm", *args, *hsdp)
    assert r.returncode == 0, r.stdout + r.stderr
    (run,) = runfolder.list_runs(root)
    prepare_id = json.loads((run.path / "prepare.json").read_text())["job_id"]
    reference_id = json.loads((run.path / "reference.json").read_text())["job_id"]
    last = run.record().last
    assert last is not None
    training_id = last.job_id
    assert f"job {training_id} waits for reference job {reference_id}" in r.stderr, r.stderr
    script = (run.submitit_dir / training_id / f"{training_id}_submission.sh").read_text()
    assert f"--dependency=afterok:{prepare_id}:{reference_id}" in script, script
    waiting = f"waiting for reference job {reference_id} (RUNNING): the reference log-probs of the pairs"
    wait_for(lambda: status.run_status(run).reason == waiting, 60, "status: the reference job running", 0.5)
    assert status.run_status(run).state == "PENDING"

    bad = cli("submit", str(tiny_job), "--executor", "slurm", *args,
              "--set", f"train.preference.reference_model={_small_vocab_llama(tmp_path / 'small')}")  # fmt: skip
    assert bad.returncode == 0, bad.stdout + bad.stderr
    (failed,) = [x for x in runfolder.list_runs(root) if x.id != run.id]

    wait_for(lambda: status.run_status(run).state == "COMPLETED", 400, "the training run", 1)
    ref, train = _sacct(slurm_cluster, reference_id), _sacct(slurm_cluster, training_id)
    assert ref["name"] == "tiny-cpu-reference" and ref["state"] == "COMPLETED", ref
    assert ref["end"] <= train["start"], (ref, train)  # (ISO times: compared as text)
    said = "".join(p.read_text() for p in run.path.glob("logs/*/rank0.log"))
    assert "reference log-probs of the train pairs: read 48 from" in said, said
    assert "reference log-probs of the eval pairs: read 16 from" in said and " computed by " not in said, said
    assert "4 ranks on 2 node(s)" in said and "mesh (2, 2) (hybrid, FSDP2)" in said, said
    first = next(row for row in run.metrics() if row.get("step") == 1)
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-5)
    reference_log = (run.path / "reference" / reference_id / f"{reference_id}_0_log.out").read_text()
    assert "[reference] reference log-probs of the train pairs: 48 computed by the starting model" in reference_log

    wait_for(lambda: status.run_status(failed).state == "CANCELLED", 120, "the bad run's training job cancelled", 1)
    st = status.run_status(failed)
    bad_ref = json.loads((failed.path / "reference.json").read_text())["job_id"]
    why = "ValueError: train.preference.reference_model: token id"
    assert st.reason.startswith(f"reference job {bad_ref} FAILED: {why}") and "never started" in st.reason, st.reason
    found = doctor.diagnose(failed, st.events, st.state.live, st.state, st.reason)
    assert found.finding is doctor.Finding.BAD_CONFIG and why in found.summary, found
    shown = cli("status", str(failed.path)).stdout
    assert f"reference job {bad_ref} FAILED: {why}" in shown, shown

    # cancelling a run whose training job waits for its reference job cancels both
    assert cli("submit", str(tiny_job), "--executor", "slurm", *args).returncode == 0
    (third,) = [x for x in runfolder.list_runs(root) if x.id not in (run.id, failed.id)]
    third_ref = json.loads((third.path / "reference.json").read_text())["job_id"]
    stopped = cli("cancel", str(third.path))
    assert stopped.returncode == 0 and "its reference job too" in stopped.stdout, stopped.stdout + stopped.stderr
    slurm_cluster.wait_sacct(third_ref, "CANCELLED", 60)
