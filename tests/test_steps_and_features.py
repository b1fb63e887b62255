"""One full fine-tune (llama-tiny, 2 gloo ranks, FSDP2, fp32, a checkpoint every 2 steps) serves
`clusterfsdp resume RUN --step N` (that checkpoint, not the newest; the steps after it recomputed
bitwise), `clusterfsdp export RUN --step N` (that checkpoint's weights, bit for bit) and the
plain run that CPU offload, activation checkpointing and `fsdp.compile` are held to: each trains
the same job from scratch and gives the same losses, within what its kernels change; a compiled
run is checked to have compiled its decoder layers (inductor's generated code for the run)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from procs import compiled_layers, inductor_env, launch, losses_by_attempt, make_run, run_workers, tiny_job_toml, wait

from clusterfsdp.core import ckptfolder, runfolder
from clusterfsdp.core.records import EventKind

JOB = tiny_job_toml(
    "steps",
    seed=11,
    steps=6,
    fsdp='sharding = "full"',
    tail="[slurm]\ntasks_per_node = 2\n[checkpoint]\nevery_steps = 2\nkeep_last = 5\n",
)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> runfolder.RunFolder:
    """6 steps on 2 ranks, checkpoints at steps 2, 4 and 6."""
    run = make_run(JOB, tmp_path_factory.mktemp("plain"))
    run_workers(run, 2, job_id="p1")
    assert [c.step for c in ckptfolder.list_checkpoints(run.checkpoints_dir())] == [2, 4, 6]
    return run


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clusterfsdp", *args], capture_output=True, text=True, timeout=600)


def test_export_step_writes_that_checkpoints_weights(plain, tmp_path):
    """`export --step 2` holds exactly the model of step 2's DCP checkpoint (which differs from the
    newest one, step 6, in every tensor)."""
    import torch
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    r = _cli("export", str(plain.path), "--step", "2", "--to", str(tmp_path / "hf"))
    assert r.returncode == 0 and "exported step 2 to" in r.stdout, r.stdout + r.stderr
    exported = load_file(tmp_path / "hf" / "model.safetensors")

    def model_state(step: int) -> dict:
        out = tmp_path / f"step{step}.pt"
        dcp_to_torch_save(ckptfolder.step_dir(plain.checkpoints_dir(), step), out)
        return torch.load(out, weights_only=False)["model"]

    at_2, at_6 = model_state(2), model_state(6)
    assert exported and set(exported) <= set(at_2), (sorted(exported), sorted(at_2))
    for name, tensor in exported.items():
        assert torch.equal(tensor, at_2[name]), name
        assert not torch.equal(tensor, at_6[name]), name


def test_resume_step_continues_from_that_checkpoint_and_repeats_the_steps_after_it(plain):
    """`resume --step 2` on the local executor: the attempt starts from step 2 (not 6), the
    checkpoints of steps 4 and 6 are set aside (kept, not used), and steps 3-6 repeat the first
    attempt's losses bitwise."""
    r = _cli("resume", str(plain.path), "--step", "2", "--executor", "local", "--follow")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumes from step 2" in r.stdout, r.stdout
    first, resumed = losses_by_attempt(plain)
    assert sorted(resumed) == [3, 4, 5, 6]
    assert resumed == {s: first[s] for s in resumed}  # bitwise
    job_id = plain.attempts[-1].job_id
    (event,) = [e for e in plain.events(job_id) if e.event is EventKind.RESUMED]
    assert event.step == 2
    root = plain.checkpoints_dir()
    assert [c.step for c in ckptfolder.list_checkpoints(root)] == [2, 4, 6]  # written again by the resumed attempt
    aside = sorted(p.name for p in root.rglob("step-*") if "set-aside" in p.parts)  # step-00000004-<time>
    assert [name.rsplit("-", 1)[0] for name in aside] == ["step-00000004", "step-00000006"], aside


# What each feature may change in the losses of the same 6 steps, against the plain run (fp32 on
# CPU): offload and activation checkpointing compute the same kernels on the same values
# (measured bitwise); compiled decoder layers and loss are inductor's fused kernels, which round
# differently (measured 4.8e-7 on losses near 5.6; test_lora.py's COMPILE_TOL likewise).
FEATURES = [
    ("cpu_offload", "fsdp.cpu_offload=true", 0.0),
    ("activation_checkpointing", "fsdp.activation_checkpointing=true", 0.0),
    ("compile", "fsdp.compile=true", 1e-4),
]


@pytest.mark.parametrize(("name", "override", "tol"), FEATURES, ids=[f[0] for f in FEATURES])
def test_full_fine_tune_feature_trains_like_the_plain_run(plain, tmp_path, name, override, tol):
    run = make_run(JOB, tmp_path, [override, "checkpoint.every_steps=0"])
    cache = tmp_path / "inductor"
    out = wait(launch(["-m", "clusterfsdp.worker", str(run.path)], 2, "f1", inductor_env(cache)))
    assert all(code == 0 for code, _ in out), "\n".join(text[-3000:] for _, text in out)
    (base,) = losses_by_attempt(plain)[:1]
    (got,) = losses_by_attempt(run)
    assert sorted(got) == list(range(1, 7)) and base[6] < base[1] - 0.3  # it trains
    assert got == pytest.approx(base, abs=tol, rel=0), (name, got, base)
    # the decoder layers compiled (only) where the job asked for it
    assert bool(compiled_layers(cache)) is (name == "compile"), sorted(p.name for p in cache.rglob("*"))
