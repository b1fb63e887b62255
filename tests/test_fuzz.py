"""A fuzz of what a user (or another user of a shared run root) can feed the read-only and checking
commands (issue 34): generated job files through `validate` (and `submit --dry-run` when it
validates), generated run folders through `status`, `status --json`, `doctor` and `runs`.

Job files: the demo job with 1-3 keys of the schema (or unknown ones, `[env]`, `[sweep]`,
`slurm.extra`, `model.from_config`) set to values of every TOML type: huge and non-finite numbers,
strings with control characters, lone surrogates and right-to-left marks, wrong types, nesting up
to 3,000 deep; sometimes with damaged bytes after them. Run folders: a healthy run with 1-3 of its
files (state.json, events.jsonl, metrics.jsonl, job.toml, trackers.json, data.json, .lock,
prepare.json) replaced by arbitrary JSON, records with one field replaced, JSON lines, deep
nesting, bytes, or a FIFO, a socket, a link to a device, a dangling or looping link, a folder.

Every input must end as the command's own answer: exit 0, or exit 1 for a run that failed
(`status`, `doctor`), or exit 2 with nothing but `error: ` lines, with output a UTF-8 terminal can
show and no raw escape character; a traceback is a failure. Hypothesis prints the failing example
and its seed; no example may take over 10 s (its deadline). Run in-process through `cli.main`
(about 5 ms an input), with a fixed seed and no example database: the same 2,100 inputs on every
run of the suite.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import stat
import tempfile
import tomllib
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st

from clusterfsdp import cli
from clusterfsdp.core import spec as S

SEED = 20261127
JOB_EXAMPLES, RUN_EXAMPLES = 1100, 1000  # 2,100 inputs
REPO = Path(__file__).resolve().parents[1]
SETTINGS = settings(
    max_examples=JOB_EXAMPLES,
    deadline=timedelta(seconds=10),
    database=None,
    derandomize=False,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)

# ---------------------------------------------------------------- values, rendered as TOML
NASTY = [
    "", ".", "..", "../..", "/nonexistent/**/*.txt", "$(touch PWNED)", "a\nb", "\x1b]0;pwned\x07", "\u202e",
    "\ud800", "\x00", "é中😀", "-rf", "#SBATCH --time=1", "1e999", "nan", "x" * 300,
]  # fmt: skip
TEXT = (
    st.text("abcxyz_-. 019", max_size=8)
    | st.sampled_from(NASTY)
    | st.text(st.characters(codec=None, exclude_categories=()), max_size=12)  # control characters, surrogates
)
SCALARS = (
    st.integers(-(10**30), 10**30)
    | st.sampled_from([2**63, -(2**63) - 1, 10**400, 0, -1, 1])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
    | TEXT
    | st.dates()
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=6
)
_BARE = re.compile(r"[A-Za-z0-9_-]+")


def toml_key(key: str) -> str:
    return key if _BARE.fullmatch(key) else json.dumps(key)


def toml_value(value: Any, ascii_only: bool = True) -> str:
    """A TOML literal of `value` (inline tables and arrays; floats' nan/inf as TOML writes them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=ascii_only)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v, ascii_only) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v, ascii_only)}" for k, v in value.items()) + " }"
    return value.isoformat()  # a date


def _deep(depth: int, kind: str) -> str:
    return "[" * depth + "1" + "]" * depth if kind == "array" else "{ a = " * depth + "1" + " }" * depth


RENDERED = (
    st.sampled_from(["1", "2", "10", "0.5", "true", "false", '"x"', '""', "[]", "{}", '"auto"', '["x"]'])  # plausible
    | st.tuples(VALUES, st.booleans()).map(lambda v: toml_value(*v))
    | st.builds(_deep, st.integers(1, 3000), st.sampled_from(["array", "table"]))
    | st.sampled_from(['"' + "1" * 5000 + '"', "1" * 5000, "'unterminated", "[1,", "{a=1", "2026-13-45"])
)


def _flat(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict) and value and prefix.count(".") < 1:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# Every key with its default value (as `init` writes it), and a neighbour of it: changes a job
# may well validate with, so that `submit --dry-run` is fuzzed too.
DEFAULTS = {k: v for k, v in _flat(tomllib.loads(S.dumps(S.loads("")))).items() if not k.startswith("job.")}
PLAUSIBLE = st.sampled_from(sorted(DEFAULTS)).flatmap(
    lambda key: st.sampled_from([DEFAULTS[key], *_neighbours(DEFAULTS[key])]).map(lambda v: (key, toml_value(v)))
)


def _neighbours(value: Any) -> list[Any]:
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, (int, float)):
        return [value + 1, value * 2]
    return []


KEYS = st.sampled_from(S.key_paths()) | st.sampled_from(
    ["env.A", "env.LD_PRELOAD", "env.PYTHONWARNINGS", "env.1A", "slurm.extra.time", "slurm.extra.x-y",
     "model.from_config.x", "sweep.grid.train.lr", "sweep.zip.train.warmup", "sweep.max_parallel", "nosuch.key",
     "train.nosuch", "job.allow_env"]
) | st.builds(lambda s, k: f"{s}.{k}", st.sampled_from(["job", "train", "env", "sweep.grid"]), TEXT)  # fmt: skip
TAILS = st.sampled_from(  # mostly none: damaged bytes end most files at the TOML parser
    [b""] * 12 + [b"\x00", b"\xff\xfe", b"\n[[slurm]]\n", b"\n[job]\nname = 'twice'\n", b"\n= 1\n", b"\r\n\t"]
)


def _base_doc(tmp: Path) -> dict[str, dict[str, str]]:
    """The demo job's tables, each value rendered, runs and data under `tmp`'s control."""
    text = (REPO / "jobs" / "tiny-cpu.toml").read_text()
    doc = tomllib.loads(text.replace('"data/corpus.txt"', f'"{REPO / "jobs" / "data" / "corpus.txt"}"'))
    doc["job"]["run_root"] = str(tmp / "runs")
    return {section: {k: toml_value(v) for k, v in body.items()} for section, body in doc.items()}


# Keys whose fuzzed values would make `submit --dry-run` write outside the test's folder.
PLACES = ("job.run_root", "job.name", "data.cache_dir", "checkpoint.dir", "log.")


def job_text(base: dict[str, dict[str, str]], changes: list[tuple[str, str]], tail: bytes) -> bytes:
    doc = {section: dict(body) for section, body in base.items()}
    for key, rendered in changes:
        section, _, rest = key.partition(".")
        table, _, varied = rest.partition(".")
        if section == "sweep" and table in ("grid", "zip") and varied:  # one key: "train.lr"
            doc.setdefault(section, {})[f"{table}.{json.dumps(varied)}"] = rendered
        else:
            doc.setdefault(section, {})[".".join(toml_key(p) for p in rest.split("."))] = rendered
    body = "".join(
        f"[{toml_key(section)}]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())
        for section, values in doc.items()
    )
    return body.encode("utf-8", "surrogatepass") + tail


# ---------------------------------------------------------------- running the CLI in-process
class Hang(Exception):
    """A command still running after LIMIT_S: a FIFO opened for reading, a read without end."""


LIMIT_S = 10.0


def _hang(signum: int, frame: object) -> None:
    raise Hang(f"still running after {LIMIT_S:g} s")


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`cli.main(argv)` in this process: (exit code, stdout, stderr). A call that blocks is
    interrupted after LIMIT_S (SIGALRM; pytest-timeout's own timer is put back after), so a hang
    fails its example instead of the whole suite."""
    out, err = io.StringIO(), io.StringIO()
    handler = signal.signal(signal.SIGALRM, _hang)
    timer = signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(argv)
            except SystemExit as e:  # argparse
                code = int(e.code or 0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
        if timer[0]:
            signal.setitimer(signal.ITIMER_REAL, *timer)
    return code, out.getvalue(), err.getvalue()


def check_answer(argv: list[str], codes: tuple[int, ...]) -> int:
    """Run `argv`; its answer must be an allowed exit code, `error: ` lines for exit 2, and text
    a UTF-8 terminal shows as text. The exit code."""
    code, out, err = run_cli(argv)  # an exception escaping main() fails the example: the traceback
    assert code in codes, (argv, code, out[-2000:], err[-2000:])
    if code == 2:
        assert err and all(line.startswith("error: ") for line in err.splitlines()), (argv, err[-2000:])
    for text in (out, err):
        text.encode("utf-8")  # no lone surrogate
        assert "\x1b" not in text and "\x07" not in text, (argv, text[-2000:])
    return code


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzzjobs")


@pytest.fixture
def no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no sbatch/scontrol: the local executor's view, no controller to ask


@pytest.mark.timeout(600)
def test_fuzzed_job_files_are_answered_by_validate_and_dry_run(job_dir, no_slurm, monkeypatch):
    print(f"fuzz seed {SEED}: {JOB_EXAMPLES} job files")
    monkeypatch.chdir(job_dir)
    base = _base_doc(job_dir)
    job = job_dir / "job.toml"
    seen = {0: 0, 2: 0}

    @seed(SEED)
    @SETTINGS
    @given(changes=st.lists(PLAUSIBLE | st.tuples(KEYS, RENDERED), min_size=1, max_size=3), tail=TAILS)
    def one(changes: list[tuple[str, str]], tail: bytes) -> None:
        text = job_text(base, changes, tail)
        note(f"job.toml: {text[:3000]!r}")
        job.write_bytes(text)
        code = check_answer(["validate", str(job)], (0, 2))
        seen[code] += 1
        if code == 0 and not any(key.startswith(PLACES) for key, _ in changes):
            check_answer(["submit", str(job), "--dry-run"], (0, 2))

    one()
    print(f"validate answered {seen}")
    assert seen[0] > 100 and seen[2] > 500, seen  # both answers exercised


# ---------------------------------------------------------------- run folders
GOOD_ATTEMPT = {"attempt": 0, "job_id": "1001", "executor": "local", "submitted": 1.0, "reason": "submit"}
GOOD_STATE = {"run_id": "x", "name": "tiny-cpu", "executor": "local", "created": 1.0, "attempts": [GOOD_ATTEMPT]}
GOOD_EVENT = {"event": "failed", "job_id": "1001", "restart": 0, "rank": 0, "host": "node1", "time": 5.0, "reason": "x"}
GOOD_ROW = {"step": 10, "loss": 4.0, "eval_loss": 4.5, "epoch": 0.5, "total_steps": 40}
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**400), 10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


def _changed(record: dict, key: str, value: Any) -> dict:
    return {**record, key: value}


def _json(value: Any) -> bytes:
    return json.dumps(value).encode("utf-8", "surrogatepass")


def _deep_json(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


RECORDS = st.one_of(
    JSON.map(_json),
    st.builds(_changed, st.just(GOOD_STATE), st.sampled_from([*GOOD_STATE, "dry_run"]), JSON).map(_json),
    st.builds(
        lambda key, value: _json({**GOOD_STATE, "attempts": [{**GOOD_ATTEMPT, key: value}]}),
        st.sampled_from([*GOOD_ATTEMPT, "leader", "cancelled", "exit_codes", "cause", "resume_step", "exclude"]),
        JSON,
    ),
    st.builds(_deep_json, st.integers(1, 100_000)),
    st.binary(max_size=64),
)
LINES = st.lists(
    st.one_of(
        st.builds(_changed, st.just(GOOD_EVENT), st.sampled_from([*GOOD_EVENT, "step", "cause", "ranks"]), JSON),
        st.builds(_changed, st.just(GOOD_ROW), st.sampled_from(list(GOOD_ROW)), JSON),
        JSON,
    ).map(_json)
    | st.builds(_deep_json, st.integers(1, 5000))
    | st.binary(max_size=32),
    max_size=4,
).map(lambda lines: b"\n".join(lines) + b"\n")
SPECIAL = st.sampled_from(["fifo", "socket", "/dev/null", "dangling", "loop", "dir"])
FILES = ["state.json", "events.jsonl", "metrics.jsonl", "job.toml", "trackers.json", "data.json", ".lock",
         "prepare.json"]  # fmt: skip
DAMAGE = st.dictionaries(
    st.sampled_from(FILES),
    st.one_of(RECORDS, LINES, SPECIAL, st.sampled_from([b"", b"[train]\nsteps = 1e400\n", b"\xff"])),
    min_size=1,
    max_size=3,
)


def _damage(path: Path, what: bytes | str) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if isinstance(what, bytes):
        path.write_bytes(what)
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "socket":
        os.mknod(path, stat.S_IFSOCK | 0o600)
    elif what == "dangling":
        path.symlink_to(path.parent / "no-such-file")
    elif what == "loop":
        path.symlink_to(path.name)
    elif what == "dir":
        path.mkdir()
    else:
        path.symlink_to(what)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A failed run's folder (doctor reads its logs and events), copied for each example."""
    from tui_helpers import make_run

    return make_run(tmp_path_factory.mktemp("fuzztemplate"), end="failed", log_lines=3, ranks=1, checkpoints=(20,)).path


@pytest.mark.timeout(600)
def test_fuzzed_run_folders_are_answered_by_status_doctor_and_runs(template, tmp_path):
    print(f"fuzz seed {SEED}: {RUN_EXAMPLES} run folders")

    @seed(SEED)
    @settings(SETTINGS, max_examples=RUN_EXAMPLES)
    @given(damage=DAMAGE)
    def one(damage: dict[str, bytes | str]) -> None:
        note(f"files: { {k: v[:3000] for k, v in damage.items()}!r}")
        root = Path(tempfile.mkdtemp(dir=tmp_path))
        try:
            run = root / "tiny-cpu" / template.name
            shutil.copytree(template, run, symlinks=True)
            for name, what in damage.items():
                _damage(run / name, what)
            for argv in (["status", str(run)], ["status", str(run), "--json"], ["doctor", str(run)]):
                check_answer(argv, (0, 1, 2))
            check_answer(["runs", "--run-root", str(root)], (0,))
            check_answer(["runs", "--json", "--run-root", str(root)], (0,))
        finally:
            shutil.rmtree(root)

    one()
