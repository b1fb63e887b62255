"""The job spec: defaults, field-level errors, cross-field checks, overrides, round-trip, fuzz."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterfsdp.core import spec as S


def errors_of(text: str, overrides: Sequence[str] = ()) -> list[str]:
    with pytest.raises(S.SpecError) as e:
        S.loads(text, overrides)
    return e.value.errors


def test_defaults_load_from_empty_file():
    """The defaults, with data.tokenizer = 'auto' decided: no model, so the byte tokenizer."""
    assert S.JobSpec().data.tokenizer == "auto"
    assert S.loads("") == S.default_tokenizer(S.JobSpec())
    assert S.loads("").data.tokenizer == "bytes"


def test_starter_file_loads_back_to_the_defaults_and_documents_every_key():
    text = S.starter_toml()
    assert S.loads(text) == S.default_tokenizer(S.JobSpec())
    for section in S.SECTIONS:
        if section != "env":
            for key, field in S.section_fields(section).items():
                assert f"# {field.metadata['doc']}\n{key} = " in text


def test_unknown_key_suggests_the_closest_name():
    assert errors_of("[slurm]\ngpu_per_node = 2\n") == ["slurm.gpu_per_node: unknown key; did you mean gpus_per_node?"]


def test_wrong_type_names_path_expected_and_found():
    assert errors_of("[slurm]\nnodes = 2.5\n") == ["slurm.nodes: expected integer or string, found number 2.5"]
    assert errors_of("[train]\nlr = true\n") == ["train.lr: expected number, found boolean True"]


def test_choice_typo_suggests_value():
    (err,) = errors_of('[fsdp]\nsharding = "hybird"\n')
    assert err.startswith("fsdp.sharding: expected one of 'hybrid' | 'full' | 'grad_op' | 'none'")
    assert err.endswith("did you mean 'hybrid'?")


def test_all_errors_are_reported_at_once():
    errs = errors_of("[slurm]\nnodez = 1\npartition = 3\n[bogus]\n")
    assert len(errs) == 3


def test_cross_field_checks():
    assert (
        "slurm.tasks_per_node: one worker per GPU is required"
        in errors_of("[slurm]\ngpus_per_node = 4\ntasks_per_node = 2\n")[0]
    )
    assert errors_of('[data]\nsource = "files"\n') == ["data.paths: source = 'files' needs at least one path"]
    assert any("signal_grace_s" in e for e in errors_of("[slurm]\ntime = 1\nsignal_grace_s = 120\n"))
    assert errors_of('[model]\npreset = "llama-tiy"\n') == [
        "model.preset: unknown preset 'llama-tiy'; did you mean llama-tiny?"
    ]
    assert errors_of('[job]\nname = "my job/1"\n') == [
        "job.name: 'my job/1' must be 1-100 letters, digits, '.', '_' or '-', and not '.' or '..' (it names a folder)"
    ]


def test_hybrid_on_one_node_falls_back_and_says_so():
    """Said on the summary's mesh line, as the default's effect: not a note, which every one-node
    job would get for a key it never set."""
    from clusterfsdp.control.summary import summary

    spec = S.loads("[slurm]\nnodes = 1\ngpus_per_node = 8\n")
    assert spec.effective_sharding == "full" and spec.mesh_shape == (8,)
    assert not any("hybrid" in n for n in spec.notices())
    assert "mesh       8 (shard), sharding full ('hybrid' on 1 node), FSDP2" in summary(spec, "here")
    spec = S.loads("[slurm]\nnodes = 4\ngpus_per_node = 8\n")
    assert spec.effective_sharding == "hybrid" and spec.mesh_shape == (4, 8)


@pytest.mark.parametrize(
    "value,minutes",
    [(90, 90), ("90", 90), ("1:30", 2), ("2:00:00", 120), ("1-0", 1440), ("1-2:30", 1590), ("1-02:30:01", 1591)],
)
def test_time_forms(value, minutes):
    assert S.parse_time_minutes(value) == minutes


@pytest.mark.parametrize("value", ["", "abc", "1-", "1:2:3:4", 0, -5, "0"])
def test_bad_times(value):
    with pytest.raises(ValueError):
        S.parse_time_minutes(value)


def test_overrides_are_typed_by_the_schema():
    spec = S.loads(
        "",
        [
            "train.lr=3e-4",
            "slurm.nodes=4",
            "slurm.partition=gpu",
            "slurm.account=123",
            "fsdp.compile=true",
            "slurm.extra={reservation='big'}",
            "env.NCCL_DEBUG=INFO",
        ],
    )
    assert spec.train.lr == 3e-4 and spec.slurm.nodes == 4 and spec.slurm.partition == "gpu"
    assert spec.slurm.account == "123" and spec.fsdp.compile is True
    assert spec.slurm.extra == {"reservation": "big"} and spec.env == {"NCCL_DEBUG": "INFO"}


def test_bad_override_is_a_field_error():
    assert errors_of("", ["slurm.max_restarts=many"]) == ["slurm.max_restarts: expected integer, found string 'many'"]
    assert "expected section.key=value" in errors_of("", ["nodes"])[0]


def test_errors_of_a_job_file_name_the_file_or_the_override_that_gave_the_key(tmp_path):
    """`--set` errors were labelled with the job file (issue 25.8); a key inside a table an
    override set is labelled with that override; the file's own errors keep the file."""
    job = tmp_path / "job.toml"
    job.write_text("[train]\nsteps = 0\n")

    def load_errors(*overrides: str) -> list[str]:
        with pytest.raises(S.SpecError) as e:
            S.load(job, overrides)
        return e.value.errors

    assert load_errors("train.stepz=3") == ["--set train.stepz=3: train.stepz: unknown key; did you mean steps?"]
    assert load_errors("train.lr=0.1", "slurm.extra={tim=5}") == [
        f"{job}: train.steps: must be >= 1, found 0",
        "--set slurm.extra={tim=5}: slurm.extra.tim: abbreviates --time, which is managed by clusterfsdp: "
        "set slurm.time",
    ]
    assert load_errors("nodes") == ["--set nodes: expected section.key=value, e.g. train.lr=3e-4"]
    assert load_errors("train.steps=1", "train.steps=x") == [
        "--set train.steps=x: train.steps: expected integer, found string 'x'"
    ]


@pytest.mark.parametrize(
    "key,error",
    [
        ("eval.nosuch", "eval.nosuch: unknown key; valid keys: fraction, paths, "),
        ("eval.fracton", "eval.fracton: unknown key; did you mean fraction?"),
        ("slurm.nodez", "slurm.nodez: unknown key; did you mean nodes?"),
        ("slurm.container.kin", "slurm.container.kin: unknown key; did you mean kind?"),
        ("trian", "trian: unknown key; did you mean train?"),
        ("train.lr.x", "train.lr.x: train.lr is a key, not a table"),
        ("env.A.B", "env.A.B: [env] holds variables (env.NAME), not tables"),
    ],
)
def test_schema_of_a_key_that_does_not_exist_is_an_error_like_the_loaders(key, error):
    """`schema eval.nosuch` printed `[eval]` and exited 0 (issue 25.8)."""
    with pytest.raises(S.SpecError) as e:
        S.describe_schema(key)
    assert len(e.value.errors) == 1 and e.value.errors[0].startswith(error), e.value.errors


@pytest.mark.parametrize("key", ["", "eval", "slurm.container", "slurm.container.kind", "checkpoint.async", "env.X"])
def test_schema_of_sections_tables_and_keys_documents_them(key):
    lines = S.describe_schema(key)
    assert lines and all(line.strip() for line in lines)
    assert not key.count(".") or f"  {key.split('.', 1)[1]}" in "\n".join(lines) or key.startswith("env.")


def test_round_trip_through_tomli_w():
    spec = S.loads(
        '[job]\nname = "x"\n[slurm]\nnodes = 2\ngpus_per_node = 4\ntime = "1-00:00:00"\n'
        'extra = { reservation = "r" }\nsetup = ["module load cuda"]\n[model]\n'
        "from_config = { num_hidden_layers = 3 }\n"
        '[checkpoint]\nasync = true\n[env]\nNCCL_DEBUG = "WARN"\n'
    )
    assert spec.checkpoint.async_ is True
    assert S.loads(S.dumps(spec)) == spec
    assert S.loads(S.starter_toml(spec)) == spec


def test_secrets_are_redacted_in_written_specs():
    spec = S.loads('[env]\nHF_TOKEN = "hf_secret"\nWANDB_API_KEY = "k"\nNCCL_DEBUG = "INFO"\n')
    text = S.dumps(spec, redact=True)
    assert "hf_secret" not in text and '"k"' not in text and "INFO" in text
    assert S.secret_env(spec) == {"HF_TOKEN": "hf_secret", "WANDB_API_KEY": "k"}
    assert S.secret_env(S.loads(text)) == {}  # a redacted file never re-exports the placeholder


def test_relative_paths_are_relative_to_the_job_file(tmp_path):
    (tmp_path / "sub").mkdir()
    job = tmp_path / "sub" / "job.toml"
    job.write_text('[job]\nrun_root = "r"\n[data]\nsource = "files"\npaths = ["../d.txt"]\n')
    spec = S.load(job)
    assert spec.job.run_root == str(tmp_path / "sub" / "r") and spec.data.paths == [str(tmp_path / "d.txt")]


def test_unreadable_files_are_one_line_errors(tmp_path):
    with pytest.raises(S.SpecError) as e:
        S.load(tmp_path / "missing.toml")
    assert e.value.errors == [f"{tmp_path / 'missing.toml'}: no such file"]
    (tmp_path / "bad.toml").write_bytes(b"\xff\xfe[")
    with pytest.raises(S.SpecError):
        S.load(tmp_path / "bad.toml")


toml_scalars = st.one_of(
    st.integers(-10, 10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.text(max_size=12),
    st.lists(st.integers(0, 3), max_size=3),
)
keys = st.sampled_from([k for s in S.SECTIONS if s != "env" for k in S.section_fields(s)] + ["bogus", "nodes"])
sections = st.sampled_from([*list(S.SECTIONS), "nope"])
documents = st.dictionaries(
    sections, st.one_of(toml_scalars, st.dictionaries(keys, toml_scalars, max_size=6)), max_size=5
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_fuzz_structured_documents_never_traceback(doc):
    """Any TOML document either loads or raises SpecError with path-prefixed lines."""
    text = tomli_w.dumps(doc)
    try:
        spec = S.loads(text)
    except S.SpecError as e:
        assert e.errors and all(isinstance(x, str) and x for x in e.errors)
    else:
        assert S.loads(S.dumps(spec)) == spec


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_fuzz_arbitrary_text_never_tracebacks(text):
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        pass
    try:
        S.loads(text)
    except S.SpecError as e:
        assert e.errors


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=4))
def test_fuzz_overrides_never_traceback(overrides):
    try:
        S.loads("", overrides)
    except S.SpecError as e:
        assert e.errors
