"""LoRA fine-tuning (`[peft] method = "lora"`) with real peft on real transformers models saved
with save_pretrained, over real gloo processes: the base stays bitwise what its files hold while
the adapters train, on FSDP2 (1 and 2 ranks), HSDP 2x2, FSDP1 and a mixture of experts; a chat
SFT run (answers-only loss) checkpoints only the adapters, resumes bitwise on the same world size
and on another one, and exports an adapter folder that `PeftModel.from_pretrained` loads with the
logits of the `--merge` export; a changed base is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from data_helpers import conversations, make_tokenizer, write_jsonl
from procs import launch, make_run, run_workers, tiny_job_toml, wait

from clusterfsdp.control import ckptfolder
from clusterfsdp.control import spec as S
from clusterfsdp.control.presets import PRESETS

TINY = {k: v for k, v in PRESETS["llama-tiny"].items() if k != "model_type"}
BASES = {
    "llama": {**TINY, "vocab_size": 400},  # the chat tokenizer's vocabulary (data_helpers.make_tokenizer)
    "mixtral": {**TINY, "vocab_size": 400, "num_local_experts": 4, "num_experts_per_tok": 2},
}

MAKE = r"""
import json, sys, torch
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM
root, bases = Path(sys.argv[1]), json.loads(sys.argv[2])
for name, keys in bases.items():
    torch.manual_seed(1)
    m = AutoModelForCausalLM.from_config(AutoConfig.for_model(name, bos_token_id=1, eos_token_id=2, **keys))
    m.save_pretrained(root / name)
"""

# Every layout on 4 ranks: build through build.build, two optimizer steps, then the base against
# its files (bitwise), the adapters against their zero init, and the loss of every step.
LAYOUTS = r"""
import json, os, sys, torch, torch.distributed as dist
from pathlib import Path
from transformers import AutoModelForCausalLM
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from clusterfsdp.control import spec as S
from clusterfsdp.worker import build as buildmod, distenv, loss as lossmod
from clusterfsdp.worker.train import _clip

os.environ.update(distenv.from_environ().export())
dist.init_process_group("gloo")
root = Path(sys.argv[1])
rank, world = dist.get_rank(), dist.get_world_size()
for family, version, nodes in (("llama", 2, 2), ("llama", 1, 2), ("mixtral", 2, 1)):
    text = (f'[model]\nname_or_path = "{root / family}"\n[peft]\nmethod = "lora"\nr = 4\n'
            f'[fsdp]\nversion = {version}\nsharding = "hybrid"\nmixed_precision = "fp32"\n'
            f'activation_checkpointing = {str(version == 2 and nodes == 2).lower()}\n'
            f'[slurm]\nnodes = {nodes}\ntasks_per_node = {world // nodes}\n[train]\nlr = 2e-3\nmax_grad_norm = 1.0\n')
    spec = S.loads(text)
    model, opt, config, counts = buildmod.build(spec, torch.device("cpu"), world, None)
    ids = torch.randint(0, 400, (8, 16), generator=torch.Generator().manual_seed(7))[rank * 2 : rank * 2 + 2]
    losses = []
    for _ in range(2):
        loss = lossmod.causal_lm_loss(model, ids, ids.clone(), compile=False, reduction="sum") / (8 * 15)
        loss.backward()
        _clip(model, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(t.item())
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    files = AutoModelForCausalLM.from_pretrained(root / family).state_dict()  # (fused experts converted)
    base = {k.replace(".base_layer", ""): v for k, v in full.items() if ".lora_" not in k}
    changed = [k for k in files if k in base and not torch.equal(files[k], base[k])]
    lora_b = [v for k, v in full.items() if ".lora_B." in k]
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    if rank == 0:
        print("RESULT " + json.dumps(dict(
            family=family, version=version, nodes=nodes, losses=losses, changed=changed,
            compared=len([k for k in files if k in base]), files=len(files),
            adapters=len(lora_b), moved=sum(bool(v.abs().sum() > 0) for v in lora_b),
            optimized=sum(len(g["params"]) for g in opt.param_groups), trained=len(trained),
            all_lora=all(".lora_" in n for n in trained), counts=[counts.total, counts.trainable],
            mesh=list(spec.mesh_shape))), flush=True)
    del model, opt
dist.destroy_process_group()
"""

EXPORT = r"""
import json, sys, torch
from pathlib import Path
from peft import PeftModel
from transformers import AutoModelForCausalLM
from clusterfsdp.control import ckptfolder, runfolder
from clusterfsdp.worker import adapters, export
from clusterfsdp.worker.model import ModelError

run_dir, base_dir, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
assert export.main([str(run_dir), "--to", str(out / "adapter")]) == 0
assert export.main([str(run_dir), "--to", str(out / "merged"), "--merge"]) == 0
assert export.main([str(run_dir), "--to", str(out / "merged16"), "--merge", "--dtype", "bfloat16"]) == 0
ids = torch.tensor([[3, 17, 99, 5, 200, 42, 7, 1, 250, 0, 13, 77]])
base = AutoModelForCausalLM.from_pretrained(base_dir)
plain = base(ids).logits
adapted = PeftModel.from_pretrained(base, out / "adapter")(ids).logits
merged = AutoModelForCausalLM.from_pretrained(out / "merged")(ids).logits
half = json.loads((out / "merged16" / "config.json").read_text())
config = json.loads((out / "adapter" / "adapter_config.json").read_text())
# A base whose weights changed since the adapters were trained is refused.
run = runfolder.RunFolder(run_dir)
info = ckptfolder.find(run.checkpoints_dir())
adapters.check_base(run.spec(), info.meta)  # the same base: accepted
(base_dir / "model.safetensors").touch()
try:
    adapters.check_base(run.spec(), info.meta)
    refused = ""
except ModelError as e:
    refused = str(e)
print("RESULT " + json.dumps(dict(
    merged_vs_adapter=(adapted - merged).abs().max().item(), adapter_vs_base=(adapted - plain).abs().max().item(),
    half_dtype=half.get("dtype") or half.get("torch_dtype"), base=config["base_model_name_or_path"],
    files=sorted(p.name for p in (out / "adapter").iterdir()), refused=refused)))
"""


def _result(text: str) -> list[dict]:
    return [json.loads(line.removeprefix("RESULT ")) for line in text.splitlines() if line.startswith("RESULT ")]


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bases")
    subprocess.run([sys.executable, "-c", MAKE, str(root), json.dumps(BASES)], check=True, timeout=300)
    return root


def test_every_layout_trains_the_adapters_and_leaves_the_base_bitwise(bases, tmp_path):
    """HSDP 2x2 (FSDP2, activation checkpointing), FSDP1 HYBRID_SHARD 2x2 and Mixtral (fused experts,
    FSDP2 over 4 ranks), gradient clipping on: the
    optimizer holds only the adapters, every base tensor equals its file after two steps, every
    adapter moved, and the same seed gives the same adapters and losses on every layout."""
    out = wait(launch(["-c", LAYOUTS, str(bases)], 4))
    assert all(code == 0 for code, _ in out), "\n".join(text[-3000:] for _, text in out)
    results = _result(out[0][1])
    assert [(r["family"], r["version"], r["mesh"]) for r in results] == [
        ("llama", 2, [2, 2]), ("llama", 1, [2, 2]), ("mixtral", 2, [4]),
    ]  # fmt: skip
    for r in results:
        assert r["changed"] == [] and r["compared"] == r["files"], r
        assert r["adapters"] > 0 and r["moved"] == r["adapters"], r  # lora_B starts at zero
        assert r["all_lora"] and r["optimized"] == r["trained"] > 0, r
        assert 0 < r["counts"][1] < r["counts"][0], r
    llama = [r["losses"] for r in results if r["family"] == "llama"]
    for other in llama[1:]:
        assert other == pytest.approx(llama[0], abs=1e-5)
    assert llama[0][1] < llama[0][0]  # it trains


def test_chat_lora_run_resumes_exactly_and_exports_adapters_and_merged(bases, tmp_path):
    tokenizer = make_tokenizer(tmp_path / "chatml")
    train = write_jsonl(tmp_path / "chat.jsonl", conversations(120))
    job = tiny_job_toml(
        "lora",
        seed=5,
        steps=4,
        fsdp='sharding = "full"',
        tail="[slurm]\ntasks_per_node = 2\n[checkpoint]\nevery_steps = 2\nkeep_last = 5\n"
        '[peft]\nmethod = "lora"\nr = 4\nalpha = 8\ntarget_modules = ["q_proj", "v_proj", "down_proj"]\n'
        'modules_to_save = ["norm"]\n',
    )
    run = make_run(
        job,
        tmp_path / "runs",
        [
            f"model.name_or_path='{bases / 'llama'}'",
            f"data.paths=['{train}']",
            "data.format='chat'",
            f"data.tokenizer='{tokenizer}'",
            "train.lr=1e-2",
            "train.micro_batch_size=1",
            "train.grad_accum=2",
        ],
    )
    first = run_workers(run, 2, job_id="l1")
    assert "trainable params" in first[0][1]
    root = run.checkpoints_dir()
    saved = json.loads((ckptfolder.step_dir(root, 4) / ckptfolder.COMPLETE).read_text())
    assert saved["peft_base"]["folder"] == str(bases / "llama")
    from torch.distributed.checkpoint.filesystem import FileSystemReader  # (metadata only)

    keys = FileSystemReader(str(ckptfolder.step_dir(root, 4))).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all(".lora_" in k or ".modules_to_save." in k for k in model_keys), model_keys

    ckptfolder.keep_only_up_to(root, 2)
    run_workers(run, 2, job_id="l2")  # the same world size: bitwise
    ckptfolder.keep_only_up_to(root, 2)
    spec = S.load(run.job_toml, ["slurm.tasks_per_node=1", "train.micro_batch_size=2"])  # same global batch
    run.job_toml.write_text(S.dumps(spec))
    resharded = run_workers(run, 1, job_id="l3")
    attempts: list[dict[int, float]] = [{}]
    for row in run.metrics():
        if attempts[-1] and row["step"] <= max(attempts[-1]):
            attempts.append({})
        attempts[-1][row["step"]] = row["loss"]
    original, same, other = attempts
    assert sorted(same) == sorted(other) == [3, 4]
    assert all(same[s] == original[s] for s in same), (same, original)  # bitwise
    assert all(other[s] == pytest.approx(original[s], abs=2e-4) for s in other)
    assert "saved by 2 ranks, now 1" in resharded[0][1]
    assert original[4] < original[1]

    r = subprocess.run(
        [sys.executable, "-c", EXPORT, str(run.path), str(bases / "llama"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (got,) = _result(r.stdout)
    assert got["merged_vs_adapter"] < 1e-4 and got["adapter_vs_base"] > 1e-3, got
    assert got["half_dtype"] == "bfloat16" and got["base"] == str(bases / "llama")
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= set(got["files"]), got
    assert "base model's weight files changed" in got["refused"], got


def test_lora_spec_is_checked_before_queueing(bases):
    """Wrong module names are named from the config alone (a preset's family) or from the
    weights' tensor names, before anything is queued."""
    from clusterfsdp.control import inputs

    with pytest.raises(S.SpecError) as e:
        S.loads(
            '[peft]\nmethod = "lora"\nr = 0\ntarget_modules = "all"\nmodules_to_save = ["lm_head"]\nuse_dora = true\n'
        )
    text = str(e.value)
    for part in ("peft.r: must be >= 1", "peft.target_modules: expected a list", "'lm_head' is the output layer",
                 "needs a pretrained base model", "peft.use_dora: DoRA is not supported"):  # fmt: skip
        assert part in text
    spec = S.loads(
        f'[model]\nname_or_path = "{bases / "mixtral"}"\n[data]\ntokenizer = "bytes"\n'
        '[peft]\nmethod = "lora"\ntarget_modules = ["q_proj", "gate_proj"]\nmodules_to_save = ["nrom"]\n'
    )
    with pytest.raises(S.SpecError) as e:
        inputs.prepare_sources(spec, "cache")
    assert e.value.errors == [
        "peft.target_modules: 'gate_proj' is not one of the linear layers of mixtral (k_proj, o_proj, q_proj, v_proj)",
        "peft.modules_to_save: the model's weights have no module 'nrom'",
    ]


def test_memory_estimate_counts_a_frozen_base_and_the_adapters(bases):
    """The compose screen's estimate: a LoRA job keeps the base without gradients or AdamW moments,
    and the adapters with all of them (torch-free, from the config)."""
    from clusterfsdp.tui import estimate

    job = f'[model]\nname_or_path = "{bases / "llama"}"\n[slurm]\ngpus_per_node = 2\n'
    full = estimate.estimate(S.loads(job))
    lora = estimate.estimate(S.loads(job + '[peft]\nmethod = "lora"\nr = 8\n'))
    assert full is not None and lora is not None and full.trainable == 0
    assert lora.trainable == 8 * 2 * 64 * 7 * 2  # r x (in + out) x 7 matrices x 2 layers
    assert lora.state_bytes == pytest.approx((4 * full.params + 16 * lora.trainable) / 2)
    assert "LoRA params" in lora.describe("GPU") and lora.state_bytes < full.state_bytes / 2
