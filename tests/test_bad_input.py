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
import random
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from clusterfsdp import cli
from clusterfsdp.control import spec as S

REPO = Path(__file__).resolve().parents[1]
BASE = (REPO / "jobs" / "tiny-cpu.toml").read_text()

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


def test_the_corpus_is_big_enough():
    assert len(corpus()) >= 1000


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
    from clusterfsdp.control import runfolder
    from clusterfsdp.control.records import Executor

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
