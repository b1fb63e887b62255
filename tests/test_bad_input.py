"""Malformed job files never produce a traceback: a generated corpus of well over 1,000 files,
each run through the real CLI entry point (`validate`, and `submit --dry-run` for the ones that
validate), must end in exit 0 or exit 2 with `error: <key>: ...` lines and nothing else.

The corpus is deterministic (seeded): every key of the schema gets every kind of wrong value,
plus structural damage (unknown sections, wrong nesting, truncation, bytes that are not UTF-8,
deep nesting). Slurm is kept off PATH here: whether a controller answers is not the subject."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from clusterfsdp import cli
from clusterfsdp.core import spec as S

REPO = Path(__file__).resolve().parents[1]
# The demo job, its data path made absolute so that copies of it elsewhere still find the corpus.
BASE = (
    (REPO / "jobs" / "tiny-cpu.toml")
    .read_text()
    .replace('"data/corpus.txt"', f'"{REPO / "jobs" / "data" / "corpus.txt"}"')
)

BAD_VALUES: list[object] = [
    "", "x" * 300, "é\u202e\u0000", "a\nb", 'q"u\\o\'te', "$(touch PWNED)", ".", "..", "/", "~", "/etc/passwd",
    0, -1, 1, 2**63, -(2**63), 0.0001, -0.5, float("nan"), float("inf"), float("-inf"), 1e308,
    True, False, [], [1, "a"], [[[[[[1]]]]]], {}, {"a": {"b": 1}}, {"x": "y"},
]  # fmt: skip


def _base() -> dict:
    import tomllib

    return tomllib.loads(BASE)


def _schema_paths() -> list[tuple[str, str]]:
    return [(section, key) for section in S.SECTIONS if section != "env" for key in S.section_fields(section)]


def corpus() -> list[tuple[str, bytes]]:
    """(name, file content) of the malformed job files."""
    rng = random.Random(20261123)
    out: list[tuple[str, bytes]] = []
    for section, key in _schema_paths():
        for i, value in enumerate(BAD_VALUES):
            doc = _base()
            doc.setdefault(section, {})[key] = value
            out.append((f"{section}.{key}.{i}", _dump(doc)))
    for i in range(150):  # several keys wrong at once
        doc = _base()
        for section, key in rng.sample(_schema_paths(), 3):
            doc.setdefault(section, {})[key] = rng.choice(BAD_VALUES)
        out.append((f"multi.{i}", _dump(doc)))
    structural = {
        "section-is-a-value": b'job = "x"\n',
        "section-is-a-list": b"[[slurm]]\nnodes = 1\n",
        "unknown-section": b"[slurmm]\nnodes = 1\n",
        "env-not-strings": b"[env]\nA = 1\nB = [1]\nC = { d = 1 }\n",
        "env-bad-name": b'[env]\n"1 A" = "x"\n',
        "deep-array": b"[model]\nfrom_config = { a = " + b"[" * 3000 + b"]" * 3000 + b" }\n",
        "deep-table": b"[model]\nfrom_config = " + b"{ a = " * 2000 + b"1" + b" }" * 2000 + b"\n",
        "not-utf8": b'[job]\nname = "\xff\xfe"\n',
        "nul-bytes": b"[job]\x00name = 1\n",
        "empty": b"",
        "only-comment": b"# nothing\n",
        "from-config-string": b'[model]\nfrom_config = "big"\n',
        "from-config-bad-types": b'[model]\nfrom_config = { num_hidden_layers = "x", hidden_size = -3 }\n',
        "time-garbage": b'[slurm]\ntime = "1-2-3"\n',
        "extra-nested": b"[slurm]\nextra = { a = { b = 1 } }\n",
        "setup-not-strings": b"[slurm]\nsetup = [1, 2]\n",
        "setup-directive": b'[slurm]\nsetup = ["#SBATCH --time=99999"]\n',
        "setup-open-quote": b'[slurm]\nsetup = ["echo \\""]\n',
        "setup-heredoc": b'[slurm]\nsetup = ["cat <<EOF"]\n',
        "extra-managed": b'[slurm]\nextra = { time = "1", array = "0-9", tim = "2" }\n',
        "env-loader": b'[env]\nLD_PRELOAD = "/tmp/evil.so"\nPYTHONPATH = "/tmp"\n',
        "revision-escape": b'[model]\nrevision = "../../../../etc"\n',
        "int-5000-digits": b"[train]\nsteps = " + b"1" * 5000 + b"\n",
        "from-config-nan": b"[model]\nfrom_config = { hidden_size = nan, x = [inf] }\n",
        "from-config-huge": b"[model]\nfrom_config = { x = 99999999999999999999 }\n",
        "caps": b"[slurm]\ntasks_per_node = 100000\n[checkpoint]\nwriter_threads = 100000\n",
    }
    out += [(name, text) for name, text in structural.items()]
    for i in range(120):  # truncations and byte flips of the valid file
        raw = bytearray(BASE.encode())
        if i % 2:
            raw = raw[: rng.randrange(len(raw))]
        else:
            for _ in range(rng.randrange(1, 6)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
        out.append((f"damaged.{i}", bytes(raw)))
    return out


def _dump(doc: dict) -> bytes:
    try:
        return tomli_w.dumps(doc).encode()
    except (TypeError, ValueError):  # tomli_w refuses some values (nan in some versions): write them by hand
        return repr(doc).encode()


def _run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # argparse
            code = int(e.code or 0)
    return code, err.getvalue()


# `--set KEY=VALUE` overrides: every key of the schema (and keys that are not) with values of
# every kind, forms that are not KEY=VALUE, and several overrides at once.
SET_VALUES = [
    "", "x", "1", "-1", "0", "1.5", "1e999", "nan", "-inf", "9" * 30, "1" * 5000, "true", "[1,", "[1, 'a']",
    "{a=1}", "{a={b=1}}", "[[[[[[1]]]]]]", "'unterminated", '"a\\u0000b"', "$(touch PWNED)", "../../x",
    "/dev/zero", "#SBATCH --time=1", "0x10", "1_000", "2026-01-01", "é\u202e", "a b", "=", "[" * 2000,
]  # fmt: skip
SET_KEYS = [
    *S.key_paths(), "env.A", "env.LD_PRELOAD", "env.1A", "slurm.extra.time", "slurm.extra.array", "slurm.extra.x-y",
    "model.from_config.x", "model.from_config.rope.x", "nosuch.key", "train.nosuch", "slurm.container.nosuch",
]  # fmt: skip
SET_FORMS = [
    "nodes", "=1", ".a=1", "a..b=1", "train.lr.x=1", "env.A.B=1", "slurm.extra.x.y=1", "train=1", "job.name.x=1",
    "train.steps", " = ", "job=x", "train.steps.=1",
]  # fmt: skip


def set_corpus() -> list[list[str]]:
    """Lists of `--set` values, one command line each."""
    rng = random.Random(20261125)
    pairs = [f"{key}={value}" for key in SET_KEYS for value in SET_VALUES]
    return [[p] for p in rng.sample(pairs, 900)] + [[f] for f in SET_FORMS] + [rng.sample(pairs, 3) for _ in range(100)]


def test_the_corpus_is_big_enough():
    assert len(corpus()) >= 1000 and len(set_corpus()) >= 1000


def test_no_malformed_job_file_gives_a_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no sbatch/scontrol: the local-executor view
    monkeypatch.chdir(tmp_path)
    failures = []
    counts = {0: 0, 2: 0}
    for name, content in corpus():
        job = tmp_path / "job.toml"
        job.write_bytes(content.replace(b'"../runs"', b'"' + str(tmp_path / "runs").encode() + b'"'))
        try:
            code, err = _run_cli(["validate", str(job)])
            if code == 0:
                code, err = _run_cli(["submit", str(job), "--dry-run"])
        except BaseException as e:  # the failure under test: anything escaping main()
            failures.append(f"{name}: {type(e).__name__}: {e}")
            continue
        if code not in (0, 2) or (code == 2 and not all(line.startswith("error: ") for line in err.splitlines())):
            failures.append(f"{name}: exit {code}: {err[:300]}")
        counts[code] = counts.get(code, 0) + 1
    assert not failures, "\n".join(failures[:20])
    assert counts[2] > 900  # nearly all of the corpus is refused, with one-line errors


def test_no_set_value_gives_a_traceback(tmp_path, monkeypatch):
    """The `--set` corpus through `validate` (and `submit --dry-run` when it validates): exit 0, or
    exit 2 with `error:` lines that name the override (or the key it reached)."""
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "job.toml"
    job.write_text(BASE.replace('"../runs"', f'"{tmp_path / "runs"}"'))
    failures, counts = [], {0: 0, 2: 0}
    for overrides in set_corpus():
        argv = [arg for item in overrides for arg in ("--set", item)]
        try:
            code, err = _run_cli(["validate", str(job), *argv])
            if code == 0:
                code, err = _run_cli(["submit", str(job), "--dry-run", *argv])
        except BaseException as e:
            failures.append(f"{overrides}: {type(e).__name__}: {e}")
            continue
        lines = err.splitlines()
        if code not in (0, 2) or (code == 2 and not (lines and all(line.startswith("error: ") for line in lines))):
            failures.append(f"{overrides}: exit {code}: {err[:300]}")
        counts[code] = counts.get(code, 0) + 1
    assert not failures, "\n".join(failures[:20])
    assert counts[0] > 50 and counts[2] > 600, counts  # both outcomes are exercised


@pytest.mark.parametrize(
    "change,message",
    [
        ({"train": {"weight_decay": float("nan")}}, "train.weight_decay: expected a finite number"),
        ({"train": {"max_grad_norm": float("inf")}}, "train.max_grad_norm: expected a finite number"),
        ({"slurm": {"mem_gb": float("nan")}}, "slurm.mem_gb: expected a finite number"),
        ({"slurm": {"mem_gb": 0.0001}}, "slurm.mem_gb: 0.0001 is less than 1 MB"),
        ({"job": {"name": "."}}, "job.name: '.' must be 1-100"),
        ({"job": {"name": ".."}}, "job.name: '..' must be 1-100"),
        ({"job": {"name": "n" * 300}}, "job.name: 'nnnn"),
    ],
)
def test_the_cases_found_by_hand_are_field_level_errors(change, message):
    doc = _base()
    for section, values in change.items():
        doc[section].update(values)
    text = "\n".join(
        f"[{section}]\n" + "\n".join(f"{k} = {_literal(v)}" for k, v in body.items()) for section, body in doc.items()
    )
    with pytest.raises(S.SpecError) as e:
        S.loads(text)
    assert any(line.startswith(message) for line in e.value.errors), e.value.errors


def _literal(value: object) -> str:
    if isinstance(value, float) and value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"  # type: ignore[operator]
    return tomli_w.dumps({"v": value}).strip().removeprefix("v = ")


def test_run_root_that_is_a_file_or_read_only_is_exit_2(tmp_path):
    """Root bypasses permission bits, so the read-only case is a real read-only mount."""
    as_file = tmp_path / "afile"
    as_file.write_text("x")
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    try:
        for root, expected in [(as_file / "runs", "is a file"), (ro / "runs", "is not writable")]:
            job = tmp_path / "job.toml"
            job.write_text(BASE.replace('"../runs"', f'"{root}"'))
            code, err = _run_cli(["submit", str(job), "--dry-run"])
            assert code == 2 and err.startswith("error: job.run_root: ") and expected in err, err
    finally:
        subprocess.run(["umount", str(ro)], check=False)


def test_a_closed_pipe_is_not_a_traceback(tmp_path):
    """`clusterfsdp runs | head -1` with more runs than head reads."""
    from clusterfsdp.core import runfolder
    from clusterfsdp.core.records import Executor

    spec = S.loads(f'[job]\nrun_root = "{tmp_path}"\n')
    for i in range(400):
        runfolder.create_run(spec, Executor.LOCAL, run_id=f"20260101-000000-{i:04x}")
    r = subprocess.run(
        f"{sys.executable} -m clusterfsdp runs --run-root {tmp_path} --limit 400 | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.stdout.startswith("RUN ") and r.stderr == "", r.stderr


def test_spec_dataclasses_document_every_field():
    """The corpus covers what the schema declares; every declared field carries a doc."""
    for section in S.SECTIONS:
        if section != "env":
            for f in dataclasses.fields(S.section_class(section)):
                assert f.metadata.get("doc"), f"{section}.{f.name}"


# ---------------------------------------------------------------- a shared cluster's job files (issue 29.6)
def spec_errors(text: str) -> list[str]:
    with pytest.raises(S.SpecError) as e:
        S.loads(text)
    return e.value.errors


def setup_toml(*lines: str) -> str:
    return tomli_w.dumps({"slurm": {"setup": list(lines)}})


@pytest.mark.parametrize(
    "line,message",
    [
        ("#SBATCH --time=99999", "slurm.setup[0]: an #SBATCH directive"),
        ("  #sbatch --array=0-99", "slurm.setup[0]: an #SBATCH directive"),
        ('echo "', "slurm.setup[0]: bash cannot parse it (unexpected EOF while looking for matching"),
        ("echo $(date", "slurm.setup: bash cannot parse these lines (line 2: unexpected EOF"),
        ("echo `date", "slurm.setup[0]: bash cannot parse it"),
        ("if true; then", "slurm.setup: bash cannot parse these lines"),
        ("cat > f <<EOF", "slurm.setup[0]: a here-document (<<)"),
        ("cat <<-'X'", "slurm.setup[0]: a here-document (<<)"),
        ("module load cuda \\", "slurm.setup[0]: a trailing backslash"),
        ("echo a\n#SBATCH --nodes=99", "slurm.setup[0]: one shell line per entry"),
    ],
)
def test_setup_lines_that_are_directives_or_break_the_script_are_refused(line, message):
    (error,) = spec_errors(setup_toml(line))
    assert error.startswith(message), error


def test_setup_lines_bash_parses_are_kept_and_the_batch_script_parses(tmp_path):
    """A construct over several entries (if/fi), a here-string and quotes are fine; the rendered
    batch script with them is valid bash (checked by bash itself)."""
    from clusterfsdp.control import launch
    from clusterfsdp.core import runfolder
    from clusterfsdp.core.records import Executor

    lines = ["if [ -f /etc/profile ]; then", '  echo "it\'s $HOSTNAME"', "fi", "read -r x <<< 'y'", "export A=1"]
    spec = S.loads(setup_toml(*lines) + f'[job]\nrun_root = "{tmp_path}"\n')
    assert spec.slurm.setup == lines
    script = launch.render_sbatch(spec, runfolder.create_run(spec, Executor.SLURM, run_id="R"))
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


@pytest.mark.parametrize(
    "key,message",
    [
        ("time", "managed by clusterfsdp: set slurm.time"),
        ("nodes", "managed by clusterfsdp: set slurm.nodes"),
        ("ntasks", "managed by clusterfsdp: one task per GPU"),
        ("ntasks-per-node", "managed by clusterfsdp: one task per GPU"),
        ("signal", "managed by clusterfsdp: set slurm.signal_grace_s"),
        ("export", "managed by clusterfsdp: [env]"),
        ("array", "managed by clusterfsdp: every array task would train into the same run folder"),
        ("requeue", "managed by clusterfsdp: set slurm.requeue"),
        ("output", "managed by clusterfsdp: the job's logs are managed"),
        ("error", "managed by clusterfsdp: the job's logs are managed"),
        ("job-name", "managed by clusterfsdp: set job.name"),
        ("hold", "managed by clusterfsdp: clusterfsdp submits, holds"),
        ("dependency", "managed by clusterfsdp: clusterfsdp submits, holds"),
        ("partition", "managed by clusterfsdp: set slurm.partition"),
        ("tim", "abbreviates --time"),
        ("arr", "abbreviates --array"),
        ("sig", "abbreviates --signal"),
    ],
)
def test_extra_options_that_override_managed_ones_are_refused(key, message):
    errors = spec_errors(f'[slurm]\nextra = {{ {key} = "1" }}\n')
    assert errors == [f"slurm.extra.{key}: {message}" + errors[0].split(message, 1)[1]], errors


def test_extra_options_of_their_own_stay_allowed():
    extra = {"reservation": "big", "gres-flags": "enforce-binding", "comment": "mine", "exclude": "n1", "gpus": 2}
    extra |= {"begin": "now+1hour", "mail-user": "me@x.org", "mem-per-gpu": "8G"}
    assert S.loads(tomli_w.dumps({"slurm": {"extra": extra}})).slurm.extra == extra


@pytest.mark.parametrize(
    "name",
    [
        "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "BASH_ENV", "ENV", "PATH", "PYTHONWARNINGS",
        "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN",
        "NCCL_PROFILER_PLUGIN", "GCONV_PATH", "PYTHONPYCACHEPREFIX",
    ],
)  # fmt: skip
def test_env_that_changes_the_code_workers_load_needs_allow_env(name):
    assert spec_errors(f'[env]\n{name} = "/tmp/x"\n') == [
        f"env.{name}: changes which code the workers load; name it in job.allow_env to set it on purpose"
    ]
    spec = S.loads(f'[job]\nallow_env = ["{name}"]\n[env]\n{name} = "/tmp/x"\n')
    assert spec.env == {name: "/tmp/x"}


def test_allow_env_names_only_the_variables_it_is_for():
    (error,) = spec_errors('[job]\nallow_env = ["NCCL_DEBUG"]\n')
    assert error.startswith("job.allow_env: 'NCCL_DEBUG' is not one of LD_PRELOAD")


@pytest.mark.parametrize("revision", ["../../x", "..", "/etc/passwd", "a/../../b", "a//b", "main/", "-rf", "a b"])
def test_revisions_that_are_paths_out_of_the_hf_cache_are_refused(revision):
    (error,) = spec_errors(tomli_w.dumps({"model": {"revision": revision}}))
    assert error.startswith(f"model.revision: {revision!r} is not a branch, tag or commit"), error


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "feature/x_y-z", "0" * 40])
def test_branch_tag_and_commit_revisions_stay_allowed(revision):
    assert S.loads(tomli_w.dumps({"model": {"revision": revision}})).model.revision == revision


@pytest.mark.parametrize(
    "text,message",
    [
        ("[train]\nsteps = 9223372036854775808\n", "train.steps: integer 9223372036854775808 does not fit in 64 bits"),
        ("[train]\nlr = -9223372036854775809\n", "train.lr: integer -9223372036854775809 does not fit in 64 bits"),
        ("[slurm]\nextra = { nice = 99999999999999999999 }\n", "slurm.extra.nice: integer 99999999999999999999"),
        ("[model]\nfrom_config = { hidden_size = nan }\n", "model.from_config.hidden_size: expected a finite number"),
        ('[model]\npreset = ""\nfrom_config = { model_type = "llama", x = inf }\n', "model.from_config.x: expected a"),
        ("[model]\nfrom_config = { rope = { f = [1, -inf] } }\n", "model.from_config.rope.f[1]: expected a finite"),
        ("[model]\nfrom_config = { x = 18446744073709551616 }\n", "model.from_config.x: integer 18446744073709551616"),
        ("[model]\nfrom_config = { x = 2026-01-01 }\n", "model.from_config.x: expected a string, number, boolean"),
        # found by tests/test_fuzz.py: 495 deep validated, then submit's job.toml writer ran out of stack
        (
            "[model]\nfrom_config.x = " + "[" * 40 + "]" * 40 + "\n",
            "model.from_config.x: lists and tables nested deeper than 32 levels",
        ),
    ],
)
def test_numbers_beyond_int64_and_not_finite_are_refused_in_every_field(text, message):
    (error,) = spec_errors(text)
    assert error.startswith(message), error


@pytest.mark.parametrize(
    "text,message",
    [
        ("[slurm]\ntasks_per_node = 257\n", "slurm.tasks_per_node: must be <= 256, found 257"),
        ("[slurm]\ngpus_per_node = 100000\n", "slurm.gpus_per_node: must be <= 256, found 100000"),
        ("[checkpoint]\nwriter_threads = 65\n", "checkpoint.writer_threads: must be <= 64, found 65"),
        ("[data]\nprepare_workers = 513\n", "data.prepare_workers: must be <= 512, found 513"),
    ],
)
def test_counts_that_start_processes_or_threads_are_capped(text, message):
    assert spec_errors(text) == [message]
    assert S.loads(text.replace(message.split("found ")[1], message.split("<= ")[1].split(",")[0]))


def test_a_5000_digit_integer_is_one_line_in_the_file_and_in_set(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(f"[train]\nsteps = {'1' * 5000}\n")
    code, err = _run_cli(["validate", str(job)])
    assert code == 2 and err == f"error: {job}: not valid TOML: an integer of more than 4300 digits\n", err
    job.write_text(BASE.replace('"../runs"', f'"{tmp_path}"'))
    code, err = _run_cli(["validate", str(job), "--set", f"train.steps={'1' * 5000}"])
    assert code == 2 and err.startswith("error: --set train.steps=1111") and err.count("\n") == 1, err


def test_job_files_that_are_not_readable_regular_files_are_one_line(tmp_path):
    """Symlinks to what cannot be read (a loop; /proc/self/mem, whose reads fail; a folder), a
    FIFO (opening it for reading would wait for a writer), /dev/zero and a 4 GiB sparse file
    (reading either would not end) are refused with one line, reading at most 1 MiB."""
    (tmp_path / "loop.toml").symlink_to(tmp_path / "loop.toml")
    (tmp_path / "mem.toml").symlink_to("/proc/self/mem")
    (tmp_path / "dir.toml").mkdir()
    os.mkfifo(tmp_path / "fifo.toml")
    with open(tmp_path / "huge.toml", "wb") as f:
        f.truncate(4 << 30)
    cases = {
        tmp_path / "loop.toml": "cannot read: Too many levels of symbolic links",
        tmp_path / "mem.toml": "cannot read: Input/output error",
        tmp_path / "dir.toml": "is a folder, not a job file",
        tmp_path / "fifo.toml": "not a regular file",
        Path("/dev/zero"): "not a regular file",
        tmp_path / "huge.toml": "larger than 1 MiB",
    }
    for path, message in cases.items():
        code, err = _run_cli(["validate", str(path)])
        assert code == 2 and err.startswith(f"error: {path}: {message}") and err.count("\n") == 1, err


def test_schema_of_an_unknown_key_exits_2_with_one_line():
    """`clusterfsdp schema eval.nosuch` printed `[eval]` and exited 0 (issue 25.8)."""
    code, err = _run_cli(["schema", "eval.fracton"])
    assert (code, err) == (2, "error: eval.fracton: unknown key; did you mean fraction?\n")
    code, err = _run_cli(["schema", "nosuch"])
    assert code == 2 and err.startswith("error: nosuch: unknown key; valid keys: job, slurm, ") and err.count("\n") == 1


def test_a_model_folder_with_fifos_is_refused_in_one_line_not_waited_on(tmp_path):
    """A FIFO planted as config.json, a weights index or a .safetensors file (a shared HF cache is
    writable by a team) was opened with plain open(): `validate` waited for a writer forever. Now
    each is a one-line problem, and a safetensors header larger than safetensors' own 100 MB limit
    is refused without reading it. Run in a child process so that a regression fails, not hangs."""
    code = f"""
import os, struct
from pathlib import Path
from clusterfsdp.core import modelsource as m
root = Path({str(tmp_path)!r})
a = root / "a"; a.mkdir(); os.mkfifo(a / "config.json")
try:
    m.read_config(a)
except ValueError as e:
    print("config:", e)
b = root / "b"; b.mkdir(); os.mkfifo(b / "model.safetensors.index.json")
print("index:", m.weight_problems("model.path", b, []))
c = root / "c"; c.mkdir(); os.mkfifo(c / "model.safetensors")
print("weights:", m.weight_problems("model.path", c, []))
d = root / "d"; d.mkdir(); (d / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{{}}")
print("huge:", m.weight_problems("model.path", d, []))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"config: {tmp_path}/a/config.json: cannot read (not a regular file (a FIFO))", lines
    assert lines[1] == f"index: ['model.path: {tmp_path}/b: unreadable weights index (not a regular file (a FIFO))']"
    not_safetensors = "model.safetensors: not a safetensors file"
    assert lines[2] == f"weights: ['model.path: {tmp_path}/c/{not_safetensors} (NotRegularFile)']"
    assert lines[3] == f"huge: ['model.path: {tmp_path}/d/{not_safetensors} (OverflowError)']"
