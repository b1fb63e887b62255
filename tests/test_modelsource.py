"""Model sources before queueing (no torch in the CLI): hub ids resolved through a HuggingFace
cache laid out the way huggingface_hub lays it out (blobs, snapshots/<commit> symlinks, refs),
in offline mode and with an unreachable hub (this machine has no network); folder checks with
exit 2 and the key named; parameter counts without torch against transformers' own."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from procs import CORPUS, launch, run_snippet, wait, write_safetensors

from clusterfsdp.core import modelsource, runfolder
from clusterfsdp.core import spec as S

COMMIT = "0123456789abcdef0123456789abcdef01234567"

MAKE = r"""
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
from clusterfsdp.worker.hfexport import byte_tokenizer
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, tie_word_embeddings=True, bos_token_id=256, eos_token_id=257, pad_token_id=258)
LlamaForCausalLM(cfg).save_pretrained(sys.argv[1])
byte_tokenizer().save_pretrained(sys.argv[1])
"""


def cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clusterfsdp.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def put_in_hub_cache(hf_home: Path, repo_id: str, folder: Path, commit: str = COMMIT, kind: str = "models") -> Path:
    """Lay `folder` out as huggingface_hub caches a download of `repo_id` at branch main:
    hub/<kind>--org--name/{blobs/<sha256>, snapshots/<commit>/<file> -> ../../blobs/<sha256>, refs/main}."""
    repo = hf_home / "hub" / f"{kind}--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for f in sorted(folder.iterdir()):
        blob = hashlib.sha256(f.read_bytes()).hexdigest()
        (repo / "blobs" / blob).write_bytes(f.read_bytes())
        (snapshot / f.name).symlink_to(f"../../blobs/{blob}")
    return snapshot


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A real model + tokenizer folder written by transformers (save_pretrained)."""
    folder = tmp_path_factory.mktemp("tiny") / "model"
    r = run_snippet(MAKE, str(folder))
    assert r.returncode == 0, r.stderr[-3000:]
    return folder


def job_file(tmp_path: Path, model: str, tokenizer: str = "bytes", extra: str = "") -> Path:
    path = tmp_path / "job.toml"
    path.write_text(
        f'[job]\nname = "hub"\nrun_root = "{tmp_path / "runs"}"\n[slurm]\ntasks_per_node = 1\n'
        f'[model]\n{model}\n[data]\nsource = "files"\npaths = ["{CORPUS}"]\ntokenizer = "{tokenizer}"\n'
        f'seq_len = 32\n[train]\nsteps = 2\nmicro_batch_size = 2\nlog_every = 1\n[fsdp]\nmixed_precision = "fp32"\n'
        + extra
    )
    return path


def test_a_hub_dataset_id_in_data_paths_resolves_to_its_cached_snapshot(tmp_path):
    """data.paths = ["org/corpus"] (not a local path): submit resolves it like a model id, from
    the HF cache offline; the run's job.toml reads the snapshot folder, sources.json records it."""
    hf_home, files = tmp_path / "hf", tmp_path / "dataset"
    files.mkdir()
    (files / "train.jsonl").write_text("".join(json.dumps({"text": f"document {i} " * 40}) + "\n" for i in range(50)))
    snapshot = put_in_hub_cache(hf_home, "org/corpus", files, kind="datasets")
    job = job_file(tmp_path, 'preset = "llama-tiny"')
    job.write_text(job.read_text().replace(f'paths = ["{CORPUS}"]', 'paths = ["org/corpus"]'))
    r = cli("submit", str(job), "--dry-run", env={"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    (run,) = runfolder.list_runs(tmp_path / "runs")
    assert run.spec().data.paths == [str(snapshot)]
    sources = json.loads((run.model_dir / "sources.json").read_text())
    assert [(s["key"], s["repo_id"], s["revision"]) for s in sources] == [("data.paths[0]", "org/corpus", COMMIT)]
    r = cli("submit", str(job), "--dry-run", env={"HF_HOME": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and r.stderr.startswith("error: data.paths[0]: 'org/corpus' is not a local path"), r.stderr


def test_hub_id_resolves_offline_from_the_cache_and_the_run_records_path_revision_and_files(tiny_model, tmp_path):
    """`submit` turns hub ids into the cached snapshot (offline: the cache only); the run's job.toml
    records the snapshot folder and commit, <run>/model/ keeps config, tokenizer and provenance,
    and the worker trains from it without the hub."""
    hf_home = tmp_path / "hf"
    snapshot = put_in_hub_cache(hf_home, "org/tiny", tiny_model)
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    job = job_file(tmp_path, 'name_or_path = "org/tiny"', tokenizer="org/tiny")
    r = cli("validate", str(job), env=env)
    assert r.returncode == 0 and f"{snapshot} (pretrained @ {COMMIT[:12]}), llama" in r.stdout, r.stdout + r.stderr
    r = cli("submit", str(job), "--dry-run", env=env)
    assert r.returncode == 0, r.stderr
    (run,) = runfolder.list_runs(tmp_path / "runs")
    spec = run.spec()
    assert (spec.model.name_or_path, spec.model.revision, spec.data.tokenizer) == (str(snapshot), COMMIT, str(snapshot))
    kept = sorted(p.relative_to(run.model_dir).as_posix() for p in run.model_dir.rglob("*") if p.is_file())
    assert "config.json" in kept and "tokenizer/tokenizer.json" in kept and "sources.json" in kept
    assert not any(k.endswith(".safetensors") for k in kept)
    sources = json.loads((run.model_dir / "sources.json").read_text())
    assert {(s["key"], s["repo_id"], s["revision"]) for s in sources} == {
        ("model.name_or_path", "org/tiny", COMMIT),
        ("data.tokenizer", "org/tiny", COMMIT),
    }
    out = wait(launch(["-m", "clusterfsdp.worker", str(run.path)], 1, extra_env=env))
    assert out[0][0] == 0, out[0][1][-3000:]
    assert [r["step"] for r in run.metrics()] == [1, 2]

    import shutil

    shutil.rmtree(hf_home)  # the originals are gone: export needs only the run folder
    exported = tmp_path / "exported"
    r = cli("export", str(run.path), "--to", str(exported), env=env)
    assert r.returncode == 0, r.stderr
    use = f"""
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained({str(exported)!r})
ids = tok("héllo", return_tensors="pt").input_ids
assert ids[0].tolist() == list("héllo".encode()), ids
out = AutoModelForCausalLM.from_pretrained({str(exported)!r}).generate(ids, max_new_tokens=5, do_sample=False)
assert out.shape == (1, ids.shape[1] + 5), out.shape
"""
    r = run_snippet(use)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("offline", ["1", "0"])
def test_an_id_neither_cached_nor_reachable_is_exit_2_with_the_command_that_fetches_it(tmp_path, offline):
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": offline}
    job = job_file(tmp_path, 'name_or_path = "org/not-here"\nrevision = "v2"')
    for command in (["validate", str(job)], ["submit", str(job), "--executor", "local"]):
        r = cli(*command, env=env)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith("error: ") and "model.name_or_path: 'org/not-here'" in r.stderr
        assert "hf download org/not-here --revision v2" in r.stderr
    assert not (tmp_path / "runs").exists()


def _folder(tmp_path: Path, kind: str) -> Path:
    f = tmp_path / kind
    f.mkdir()
    config = {"model_type": "llama", "hidden_size": 8}
    if kind != "no-config":
        (f / "config.json").write_text(json.dumps(config) if kind != "no-model-type" else "{}")
    if kind in ("ok", "no-config", "no-model-type"):
        write_safetensors(f / "model.safetensors", {"a": [2, 4], "b": [3]})
    if kind == "truncated":
        write_safetensors(f / "model.safetensors", {"a": [2, 4]}, truncate=4)
    if kind == "missing-shard":
        index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
        (f / "model.safetensors.index.json").write_text(json.dumps(index))
        write_safetensors(f / "model-00001-of-00002.safetensors", {"a": [2, 4]})
    return f


@pytest.mark.parametrize(
    "kind,set_,expected",
    [
        ("no-config", "name_or_path", "has no config.json"),
        ("no-model-type", "name_or_path", "has no model_type"),
        ("no-weights", "name_or_path", "has no weights (*.safetensors or pytorch_model*.bin)"),
        ("truncated", "name_or_path", "model.safetensors: truncated"),
        ("missing-shard", "name_or_path", "lacks model-00002-of-00002.safetensors"),
        ("no-config", "config", "has no config.json"),
        ("ok", "tokenizer", "has no tokenizer files"),
        ("gone", "name_or_path", "no such folder"),
    ],
)
def test_bad_model_and_tokenizer_folders_are_exit_2_naming_the_key(tmp_path, kind, set_, expected):
    folder = _folder(tmp_path, kind) if kind != "gone" else tmp_path / "gone"
    key = {"tokenizer": "data.tokenizer", "config": "model.config", "name_or_path": "model.name_or_path"}[set_]
    model = f'name_or_path = "{folder}"'  # (for the tokenizer case: a good model folder without tokenizer files)
    if set_ == "config":
        model = f'config = "{folder}"'
    job = job_file(tmp_path, model, tokenizer=str(folder) if set_ == "tokenizer" else "bytes")
    for command in (["validate", str(job)], ["submit", str(job), "--executor", "local"]):
        r = cli(*command, env={"HF_HUB_OFFLINE": "1"})
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert f"{key}: " in r.stderr and expected in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()


def test_a_good_folder_passes_and_counts_its_parameters_from_the_headers(tmp_path):
    job = job_file(tmp_path, f'name_or_path = "{_folder(tmp_path, "ok")}"')
    r = cli("validate", str(job), env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    assert "(pretrained), llama, 0.0M params" in r.stdout  # 2*4 + 3 = 11 elements, exactly
    assert "data.tokenizer = 'bytes' with pretrained weights" in r.stdout  # a note, not an error


@pytest.mark.parametrize(
    "model,error",
    [
        ('preset = ""', 'model.preset: "" needs model.from_config.model_type'),
        ('from_config = { model_type = "qwen2" }', "differs from preset 'llama-tiny' (llama)"),
        ('name_or_path = "/x"\nconfig = "/y"', "model.config: random init from a config and model.name_or_path"),
    ],
)
def test_model_keys_that_contradict_each_other_are_field_errors(model, error):
    with pytest.raises(S.SpecError) as e:
        S.loads(f"[model]\n{model}\n")
    assert any(error in line for line in e.value.errors), e.value.errors


def test_random_init_of_any_family_from_model_type_and_keys_validates():
    spec = S.loads('[model]\npreset = ""\nfrom_config = { model_type = "qwen2", hidden_size = 64, vocab_size = 300 }\n')
    assert spec.model.from_config["model_type"] == "qwen2"


PARAM_COUNT = r"""
import json, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
out = {}
for model_type, keys in json.loads(sys.argv[1]).items():
    config = AutoConfig.for_model(model_type, **keys)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    out[model_type] = [json.loads(config.to_json_string()), sum(p.numel() for p in model.parameters())]
print(json.dumps(out))
"""

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)


def test_torch_free_parameter_estimate_matches_transformers():
    """Exact for the families modelsource lists as exact; within 1% for others (their extras)."""
    configs = {
        "llama": SMALL,
        "mistral": SMALL,
        "qwen2": SMALL,
        "gemma": {**SMALL, "head_dim": 16},
        "phi3": {**SMALL, "pad_token_id": 0},
        "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=128),
        "gpt_neox": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256),
        "gpt_bigcode": dict(n_embd=64, n_layer=2, n_head=4, n_positions=128),
        "starcoder2": SMALL,
        "mixtral": {**SMALL, "num_local_experts": 4, "num_experts_per_tok": 2},
        "qwen2_moe": {**SMALL, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "num_experts": 4},
        "qwen3": {**SMALL, "head_dim": 16},
        "olmo2": SMALL,
        "opt": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=96, word_embed_proj_dim=64),
    }
    configs = {k: {**v, "vocab_size": 300} for k, v in configs.items()}
    r = subprocess.run([sys.executable, "-c", PARAM_COUNT, json.dumps(configs)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    for model_type, (config, real) in json.loads(r.stdout.splitlines()[-1]).items():
        est = modelsource.param_estimate(config)
        if model_type in modelsource.EXACT_FAMILIES:
            assert est.total == real and est.exact, (model_type, est.total, real)
        else:
            assert abs(est.total - real) / real < 0.01 and not est.exact, (model_type, est.total, real)
    mixtral = modelsource.param_estimate(json.loads(r.stdout.splitlines()[-1])["mixtral"][0])
    assert mixtral.total - mixtral.active == 2 * 2 * 3 * 64 * 96  # 2 layers x 2 idle experts x 3 matrices


# ---------------------------------------------------------------- data.tokenizer = 'auto' (issue 25.6)
def auto_job(tmp_path: Path, model: str, extra: str = "") -> Path:
    """A job that does not name data.tokenizer (the default, 'auto')."""
    job = job_file(tmp_path, model, extra=extra)
    job.write_text(job.read_text().replace('tokenizer = "bytes"\n', ""))
    return job


TOKEN_IDS = """
import sys
from pathlib import Path
from clusterfsdp.core.runfolder import RunFolder
from clusterfsdp.worker.train import token_ids
from clusterfsdp.data.tokens import load_tokenizer
spec = RunFolder(Path(sys.argv[1])).spec()
print(type(load_tokenizer(spec.data.tokenizer)).__module__.split(".")[0], token_ids(spec))
"""


def test_a_pretrained_folder_with_a_tokenizer_trains_on_its_tokenizer_by_default(tiny_model, tmp_path):
    """No data.tokenizer and a model folder written by save_pretrained with its tokenizer: validate
    says the model's own is used, the run's job.toml records the folder, <run>/model/tokenizer/
    keeps its files, and what the worker loads from that job.toml is the HF tokenizer."""
    job = auto_job(tmp_path, f'name_or_path = "{tiny_model}"')
    assert S.load(job).data.tokenizer == str(tiny_model)
    r = cli("validate", str(job), env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    assert f"tokenizer  {tiny_model} (the model's own)" in r.stdout and "with pretrained weights" not in r.stdout
    r = cli("submit", str(job), "--dry-run", env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    (run,) = runfolder.list_runs(tmp_path / "runs")
    assert f'tokenizer = "{tiny_model}"' in run.job_toml.read_text()
    assert (run.model_dir / "tokenizer" / "tokenizer.json").is_file()
    r = subprocess.run([sys.executable, "-c", TOKEN_IDS, str(run.path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    # a transformers tokenizer (the fixture's has the byte ids: 256 bytes + bos, eos, pad), not the built-in one
    assert r.stdout.startswith("transformers TokenIds(vocab=259, bos=256, eos=257, pad=258)"), r.stdout


def test_auto_resolves_a_hub_model_to_its_snapshot_tokenizer_and_records_where_from(tiny_model, tmp_path):
    hf_home = tmp_path / "hf"
    snapshot = put_in_hub_cache(hf_home, "org/tiny", tiny_model)
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    job = auto_job(tmp_path, 'name_or_path = "org/tiny"')
    assert S.load(job).data.tokenizer == "auto"  # a hub id: decided when it is resolved
    r = cli("validate", str(job), env=env)
    assert r.returncode == 0 and f"tokenizer  {snapshot} (the model's own)" in r.stdout, r.stdout + r.stderr
    r = cli("submit", str(job), "--dry-run", env=env)
    assert r.returncode == 0, r.stderr
    (run,) = runfolder.list_runs(tmp_path / "runs")
    assert run.spec().data.tokenizer == str(snapshot)
    sources = json.loads((run.model_dir / "sources.json").read_text())
    assert {(s["key"], s["given"], s["repo_id"], s["revision"]) for s in sources} == {
        ("model.name_or_path", "org/tiny", "org/tiny", COMMIT),
        ("data.tokenizer", "auto", "org/tiny", COMMIT),
    }


def test_auto_is_bytes_for_random_init_and_for_weights_without_a_tokenizer(tmp_path):
    random_init = auto_job(tmp_path, 'preset = "llama-tiny"')
    assert S.load(random_init).data.tokenizer == "bytes"
    r = cli("validate", str(random_init))
    assert r.returncode == 0 and "tokenizer  bytes (built-in byte-level)" in r.stdout, r.stdout + r.stderr
    weights = _folder(tmp_path, "ok")  # config.json + safetensors, no tokenizer files
    job = auto_job(tmp_path, f'name_or_path = "{weights}"')
    assert S.load(job).data.tokenizer == "bytes"
    r = cli("validate", str(job), env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0 and "tokenizer  bytes" in r.stdout, r.stdout + r.stderr
    assert f"with pretrained weights: {weights} has no tokenizer files, so the model trains on ids" in r.stdout


def test_explicit_bytes_with_a_model_that_has_a_tokenizer_is_kept_with_a_note(tiny_model, tmp_path):
    job = job_file(tmp_path, f'name_or_path = "{tiny_model}"', tokenizer="bytes")
    assert S.load(job).data.tokenizer == "bytes"
    r = cli("validate", str(job), env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0 and "the model's own tokenizer is not used ('auto' uses it)" in r.stdout, r.stdout


def test_chat_data_without_any_tokenizer_is_refused_before_queueing(tmp_path):
    weights = _folder(tmp_path, "ok")
    job = auto_job(tmp_path, f'name_or_path = "{weights}"')
    job.write_text(job.read_text().replace("seq_len", 'format = "chat"\nseq_len'))
    with pytest.raises(S.SpecError) as e:
        S.load(job)
    assert e.value.errors == [
        f"{job}: data.format: 'chat' needs a tokenizer with a chat template; data.tokenizer = 'bytes' has none "
        "(model.name_or_path has no tokenizer files: set data.tokenizer)"
    ]
    with pytest.raises(S.SpecError) as e:
        S.loads('[data]\nsource = "files"\npaths = ["x"]\nformat = "chat"\n')
    assert e.value.errors == [  # 'auto' without a model is 'bytes'
        "data.format: 'chat' needs a tokenizer with a chat template; data.tokenizer = 'bytes' has none"
    ]


CACHE_ONLY = """
import sys
from clusterfsdp.core import modelsource, spec as S
spec = S.loads('[model]\\nname_or_path = "org/not-cached"\\n[data]\\nsource = "files"\\npaths = ["/x"]\\n')
out = modelsource.prepare(spec, mode="cache")
print(out.spec.data.tokenizer)
print("\\n".join(out.notes))
"""


def test_auto_with_a_hub_model_not_in_the_cache_is_decided_at_submit(tmp_path):
    """The TUI's review (cache only): the model's tokenizer cannot be known yet; said, not refused."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
    r = subprocess.run([sys.executable, "-c", CACHE_ONLY], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[0] == "bytes"
    assert "data.tokenizer: 'auto' is decided when submit fetches org/not-cached" in r.stdout
