"""FSDP2 full, FSDP2 hybrid (HSDP, 2x2 mesh) and FSDP1 HYBRID_SHARD over 4 real gloo processes
give the loss trajectory of a single-process reference run with the same global batch."""

from __future__ import annotations

import subprocess
import sys

import pytest
from procs import launch, losses, make_run, run_workers, tiny_job_toml, wait

JOB = tiny_job_toml("par", seed=3, steps=6)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, float]:
    """One process, micro-batch 8: the same 8 samples per step that 4 ranks x 2 see."""
    run = make_run(JOB, tmp_path_factory.mktemp("ref"), ["train.micro_batch_size=8", "fsdp.sharding='full'"])
    run_workers(run, 1)
    return losses(run)


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("fsdp2-full", ["fsdp.sharding='full'", "slurm.tasks_per_node=4"]),
        ("fsdp2-hybrid-2x2", ["fsdp.sharding='hybrid'", "slurm.nodes=2", "slurm.tasks_per_node=2"]),
        ("fsdp1-hybrid-2x2", ["fsdp.version=1", "fsdp.sharding='hybrid'", "slurm.nodes=2", "slurm.tasks_per_node=2"]),
        (
            "fsdp2-full-accum",
            ["fsdp.sharding='full'", "slurm.tasks_per_node=2", "train.micro_batch_size=2", "train.grad_accum=2"],
        ),
    ],
)
def test_matches_single_process_reference(reference, tmp_path, name, overrides):
    run = make_run(JOB, tmp_path, overrides)
    spec = run.spec()
    world = spec.world_size
    out = run_workers(run, world)
    got = losses(run)
    assert sorted(got) == list(range(1, 7))
    assert reference[6] < reference[1] - 0.3  # it trains
    for step in got:
        assert got[step] == pytest.approx(reference[step], abs=2e-4), (name, step, got, reference)
    if "hybrid" in name:
        assert "mesh (2, 2) (hybrid" in out[0][1]


CHECK = r"""
import sys, torch, torch.distributed as dist
from clusterfsdp.control import spec as S
from clusterfsdp.worker import train, distenv
import os
os.environ.update(distenv.from_environ().export())
dist.init_process_group("gloo")
spec = S.loads(sys.argv[1])
model, _, config, _ = train.build(spec, torch.device("cpu"), dist.get_world_size(), None)
ids = torch.tensor([[3, 17, 99, 5, 200, 42, 7, 1]])
with torch.no_grad():
    logits = model(input_ids=ids).logits
from transformers import AutoModelForCausalLM
ref = AutoModelForCausalLM.from_pretrained(spec.model.name_or_path)
with torch.no_grad():
    expected = ref(input_ids=ids).logits
torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
out, inp = model.get_output_embeddings(), model.get_input_embeddings()
assert out.weight is inp.weight, "tie lost"
print("OK", dist.get_rank(), float(logits.abs().sum()))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("version,sharding,nodes", [(2, "full", 1), (2, "hybrid", 2), (1, "hybrid", 2)])
def test_from_pretrained_weights_really_load_and_stay_tied(tmp_path, version, sharding, nodes):
    """A local HF folder loaded through meta -> shard -> materialize -> load gives the unsharded logits."""
    make = subprocess.run(
        [
            sys.executable,
            "-c",
            f"""
import torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(1)
cfg = LlamaConfig(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, tie_word_embeddings=True)
m = LlamaForCausalLM(cfg)
with torch.no_grad():
    for p in m.parameters():
        p.normal_(0, 0.5)   # far from any init, so a failed load cannot pass
m.save_pretrained({str(tmp_path / "hf")!r})
""",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert make.returncode == 0, make.stderr
    job = (
        f'[model]\nname_or_path = "{tmp_path / "hf"}"\n[fsdp]\nversion = {version}\nsharding = "{sharding}"\n'
        f'mixed_precision = "fp32"\n[slurm]\nnodes = {nodes}\ntasks_per_node = {4 // nodes if nodes > 1 else 2}\n'
    )
    world = 4 if nodes > 1 else 2
    out = wait(launch(["-c", CHECK, job], world))
    assert all(code == 0 for code, _ in out), out[0][1][-3000:]
    sums = {text.split()[-1] for _, text in out}
    assert len(sums) == 1  # every rank computed the same logits
