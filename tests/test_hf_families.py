"""Any AutoModelForCausalLM family, loaded exactly and initialized deterministically.

Tiny models of six families (Llama, Qwen2, Gemma, GPT-2, GPT-NeoX, Mixtral), and HRM-text (whose
files hold dense fused weights that transformers splits while loading), are saved by
`save_pretrained` (every weight perturbed, so a weight that is not loaded cannot pass), plus
GPT-2 as published on the hub (no `transformer.` prefix, old `attn.bias` buffers, no lm_head)
and a Llama folder missing one tensor. One 1-rank and one 4-rank launch build every family
through `worker.build.build_model` with FSDP2 and FSDP1 (and HSDP 2x2 for two of them) and report, per rank:
the max |logits - AutoModelForCausalLM.from_pretrained(folder) logits| in fp32, a digest of the
random-init weights, the parameter counts, buffers against transformers' own, and the one-line
errors of models that cannot be loaded. The assertions compare across ranks, world sizes and
FSDP versions.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from procs import launch, run_snippet, wait

B = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)
FAMILIES = {
    "llama": {**B, "tie_word_embeddings": True},
    "qwen2": B,
    "gemma": {**B, "head_dim": 16},
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=64),
    "gpt_neox": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128),
    "mixtral": {**B, "num_local_experts": 4, "num_experts_per_tok": 2},
    # Its files hold fused gate_up_proj / gqkv_proj that transformers chunks along dim 0 while loading:
    # sharded along dim 0, every rank would read the wrong rows (silently); these load along dim 1.
    "hrm_text": {
        **{k: v for k, v in B.items() if k != "num_hidden_layers"},  # (layers come from the stacks)
        "num_key_value_heads": 4,
        "head_dim": 16,
        "num_layers_per_stack": 2,
        "H_cycles": 1,
        "L_cycles": 1,
        "L_bp_cycles": [1],
    },
}
# Loaded on a 2x2 (replicate x shard) mesh too: (family, FSDP version)
HSDP = {("llama", 2), ("llama", 1), ("mixtral", 2)}


def builds(world: int) -> list[tuple[str, int, str, str]]:
    """(family, FSDP version, sharding, source) of every model one launch builds: every family
    pretrained with FSDP2 and FSDP1 and random init with FSDP2 (and on 4 ranks FSDP1 for three of
    them, enough to show both versions init alike); on 4 ranks the HSDP layouts."""
    out = [(f, v, "full", "name_or_path") for f in [*FAMILIES, "gpt2-hub"] for v in (2, 1)]
    out += [(f, 2, "full", "config") for f in FAMILIES]
    if world == 4:
        out += [(f, 1, "full", "config") for f in ("llama", "gpt_neox", "mixtral")]
        out += [(f, v, "hybrid", "name_or_path") for f, v in sorted(HSDP)]
    return out


MAKE = r"""
import json, sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM
root, families = Path(sys.argv[1]), json.loads(sys.argv[2])
for name, keys in families.items():
    torch.manual_seed(1)
    cfg = AutoConfig.for_model(name, vocab_size=256, bos_token_id=1, eos_token_id=2, pad_token_id=0, **keys)
    m = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)   # far from any init: a weight not loaded shows
    m.save_pretrained(root / name)
# GPT-2 as the hub has it: no 'transformer.' prefix, causal-mask buffers, lm_head left to the tie
hub = root / "gpt2-hub"
hub.mkdir()
(hub / "config.json").write_text((root / "gpt2" / "config.json").read_text())
state = {k.removeprefix("transformer."): v for k, v in load_file(root / "gpt2" / "model.safetensors").items()
         if k != "lm_head.weight"}
for i in range(2):
    state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64)
save_file(state, hub / "model.safetensors", metadata={"format": "pt"})
# A Llama folder that lacks one tensor
bad = root / "llama-missing"
bad.mkdir()
(bad / "config.json").write_text((root / "llama" / "config.json").read_text())
state = load_file(root / "llama" / "model.safetensors")
del state["model.layers.1.mlp.down_proj.weight"]
save_file(state, bad / "model.safetensors", metadata={"format": "pt"})
"""

CHECK = r"""
import hashlib, json, os, sys, torch, torch.distributed as dist
from pathlib import Path
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import AutoModelForCausalLM
from clusterfsdp.core import spec as S
from clusterfsdp.worker import build as buildmod, distenv
from clusterfsdp.worker.model import ModelError, canonical

os.environ.update(distenv.from_environ().export())
dist.init_process_group("gloo")
root, plan = Path(sys.argv[1]), json.loads(sys.argv[2])
rank, world = dist.get_rank(), dist.get_world_size()
ids = torch.tensor([[3, 17, 99, 5, 200, 42, 7, 1, 250, 0, 13, 77]])

def job(model: str, version: int, sharding: str) -> str:
    nodes, tasks = (2, world // 2) if sharding == "hybrid" else (1, world)
    return (f'[model]\n{model}\n[fsdp]\nversion = {version}\nsharding = "{sharding}"\nmixed_precision = "fp32"\n'
            f'[slurm]\nnodes = {nodes}\ntasks_per_node = {tasks}\n')

def report(**fields):
    print("RESULT " + json.dumps({"rank": rank, "world": world, **fields}), flush=True)

def build(text):
    model, config, counts = buildmod.build_model(S.loads(text), torch.device("cpu"), world, None)
    return model, config, counts

references = {}
for fam, version, sharding, source in plan:
    if fam not in references:
        ref = AutoModelForCausalLM.from_pretrained(root / fam.removesuffix("-hub"))  # eval mode, fp32
        with torch.no_grad():
            references[fam] = (ref(input_ids=ids).logits, dict(ref.named_buffers()))
    expected, ref_buffers = references[fam]
    model, config, counts = build(job(f'{source} = "{root / fam}"', version, sharding))
    digest = oversized = staged = None
    if source == "name_or_path" and version == 2:  # each rank holds its shards only, and they deep-copy
        from torch.distributed._state_dict_utils import _create_cpu_state_dict

        local = [(n, p.to_local()) for n, p in model.named_parameters()]
        oversized = [n for n, t in local if t.untyped_storage().nbytes() > t.numel() * t.element_size()]
        try:  # what the async checkpoint's staging buffers are made with
            _create_cpu_state_dict(get_model_state_dict(model))
            staged = "ok"
        except RuntimeError as e:
            staged = str(e)
    if source == "config":  # random init: a digest of the full weights
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        digest = hashlib.sha256(b"".join(full[k].numpy().tobytes() for k in sorted(full))).hexdigest()[:16]
    buffers = {canonical(n): b for n, b in model.named_buffers()}
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    tied = config.tie_word_embeddings
    report(fam=fam, version=version, sharding=sharding, source=source, digest=digest, oversized=oversized,
           staged=staged,
           diff=float((logits - expected).abs().max()), total=counts.total, active=counts.active,
           missing_buffers=sorted(n for n in ref_buffers if n not in buffers),
           buffers_equal=all(n in buffers and torch.equal(buffers[n], b) for n, b in ref_buffers.items()),
           tie_kept=(not tied) or model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    if world == 1 and source == "config":  # random init is the family's own init
        own = AutoModelForCausalLM.from_config(config).state_dict()
        worst = 0.0
        for k, t in own.items():
            mine = full[k]
            if t.numel() > 1 and bool((t == t.flatten()[0]).all()):
                worst = max(worst, float((mine != t).any()))          # ones, zeros: identical
            elif t.numel() >= 1000:
                worst = max(worst, abs(float(mine.std() / t.std()) - 1))  # same distribution
        report(fam=fam, init_worst=worst)
    del model

cases = {
    "missing-tensor": f'name_or_path = "{root / "llama-missing"}"',
    "no-causal-lm": 'preset = ""\nfrom_config = {{ model_type = "t5" }}',
    "unknown-type": 'preset = ""\nfrom_config = {{ model_type = "no_such_family" }}',
}
for case, model in cases.items():
    try:
        build(job(model.replace("{{", "{").replace("}}", "}"), 2, "full"))
        report(case=case, error=None)
    except ModelError as e:
        report(case=case, error=str(e))
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("families")
    r = run_snippet(MAKE, str(root), json.dumps(FAMILIES))
    assert r.returncode == 0, r.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def results(folders) -> list[dict]:
    """RESULT records of a 1-rank and a 4-rank launch (run one after the other: 2 cores)."""
    rows = []
    for world in (1, 4):
        out = wait(launch(["-c", CHECK, str(folders), json.dumps(builds(world))], world))
        assert all(code == 0 for code, _ in out), "\n".join(text[-4000:] for _, text in out)
        for _, text in out:
            rows += [json.loads(line[7:]) for line in text.splitlines() if line.startswith("RESULT ")]
    return rows


def loads(results: list[dict]) -> list[dict]:
    return [r for r in results if "source" in r]


def test_every_family_loads_exactly_on_1_and_4_ranks_with_fsdp2_and_fsdp1(results):
    """Logits equal AutoModelForCausalLM.from_pretrained's (fp32) for every family, hub-style GPT-2
    included, on every rank of every layout; buffers equal transformers' own, ties kept."""
    pretrained = [r for r in loads(results) if r["source"] == "name_or_path"]
    seen = {(r["fam"], r["world"], r["version"], r["sharding"]) for r in pretrained}
    for fam in [*FAMILIES, "gpt2-hub"]:
        for world in (1, 4):
            for version in (1, 2):
                assert (fam, world, version, "full") in seen, (fam, world, version)
    assert {(r["fam"], r["version"]) for r in pretrained if r["sharding"] == "hybrid"} == HSDP
    bad = [r for r in pretrained if r["diff"] > 1e-5]
    assert not bad, bad
    assert [r for r in loads(results) if r["missing_buffers"]] == []  # every buffer of transformers' own
    assert all(r["buffers_equal"] and r["tie_kept"] for r in loads(results))


def test_each_rank_keeps_only_its_shards_of_pretrained_weights(results):
    """FSDP2 on CPU: every shard has a storage of its own (they were views of the whole weights
    transformers read, so each rank kept the whole model, and the async checkpoint's staging
    copy failed on ranks > 0: issue 40's cross product)."""
    fsdp2 = [r for r in loads(results) if r["source"] == "name_or_path" and r["version"] == 2]
    assert {r["world"] for r in fsdp2} == {1, 4}
    assert [(r["fam"], r["rank"], r["oversized"]) for r in fsdp2 if r["oversized"]] == []
    assert {r["staged"] for r in fsdp2} == {"ok"}


def test_random_init_is_identical_for_every_world_size_and_fsdp_version(results):
    """FSDP2 on 1 rank, FSDP2 (and FSDP1) on 4 ranks: the same weights, bit for bit."""
    digests = defaultdict(set)
    for r in loads(results):
        if r["source"] == "config":
            digests[r["fam"]].add(r["digest"])
    assert {(r["fam"], r["world"], r["version"]) for r in loads(results) if r["source"] == "config"} == {
        (f, w, v) for f in FAMILIES for w, v in ((1, 2), (4, 2))
    } | {("llama", 4, 1), ("gpt_neox", 4, 1), ("mixtral", 4, 1)}
    assert all(len(d) == 1 for d in digests.values()), digests


def test_random_init_is_each_family_own_init(results):
    """Constant tensors (norms, biases, Gemma's zero-centred norms) equal transformers' from_config;
    random ones have its standard deviation (GPT-2's scaled c_proj included) within 25%."""
    worst = {r["fam"]: r["init_worst"] for r in results if "init_worst" in r}
    assert set(worst) == set(FAMILIES)
    assert all(w < 0.25 for w in worst.values()), worst


def test_param_count_is_the_same_on_every_world_size_and_fsdp_version(results):
    counts = defaultdict(set)
    for r in loads(results):
        counts[r["fam"].removesuffix("-hub")].add((r["total"], r["active"]))
    assert all(len(c) == 1 for c in counts.values()), counts
    ((total, active),) = counts["mixtral"]
    experts = 2 * 4 * 64 * 3 * 96  # 2 layers x 4 experts x (gate, up, down) of 64 x 96
    assert active == total - experts // 2  # 2 of 4 experts per token
    assert all(t == a for f, c in counts.items() if f != "mixtral" for t, a in c)


def test_models_that_cannot_be_loaded_stop_with_one_line_naming_the_model_type(results):
    errors = defaultdict(set)
    for r in results:
        if "case" in r:
            errors[r["case"]].add(r["error"])
    assert all(len(e) == 1 and None not in e for e in errors.values()), errors  # every rank, same line
    (missing,) = errors["missing-tensor"]
    assert missing.startswith("model type 'llama':") and "model.layers.1.mlp.down_proj.weight" in missing
    (t5,) = errors["no-causal-lm"]
    assert t5.startswith("model type 't5':") and "\n" not in t5
    (unknown,) = errors["unknown-type"]
    assert unknown.startswith("model.from_config:") and "no_such_family" in unknown


def test_fused_experts_are_sharded_only_along_dims_that_read_exactly():
    """Mixtral's gate_up_proj [experts, 2*I, H] is w1 and w3 joined along dim 1: sharding that dim
    would give rank r [w1_r; w3_r] (silently wrong). Experts (dim 0) split when every rank gets one,
    else H (dim 2) when it divides, else a clear error."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from clusterfsdp.worker import weights
    from clusterfsdp.worker.model import ModelError

    config = AutoConfig.for_model("mixtral", vocab_size=256, **FAMILIES["mixtral"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    plan = weights.plan(model, torch.float32)
    gate_up = model.get_parameter("model.layers.0.mlp.experts.gate_up_proj")
    assert tuple(gate_up.shape) == (4, 192, 64) and plan.touched["model.layers.0.mlp.experts.gate_up_proj"] == {1}
    assert gate_up not in weights.shard_dims(model, plan, 2)  # 2 experts per rank: the default dim 0
    assert weights.shard_dims(model, plan, 8)[gate_up] == 2  # 4 experts on 8 ranks: along H
    with pytest.raises(ModelError, match=r"experts.gate_up_proj \(4, 192, 64\) cannot be sharded over 3 ranks"):
        weights.shard_dims(model, plan, 3)
