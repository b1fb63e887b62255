"""CLI exit codes, one-line errors, and a control plane that never imports torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterfsdp.core import spec as S


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clusterfsdp.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_validate_ok_prints_a_summary(tiny_job):
    r = cli("validate", str(tiny_job))
    assert r.returncode == 0, r.stderr
    assert "1 node(s) x 2 worker(s) (CPU) = 2 ranks" in r.stdout and "mesh       2 (shard)" in r.stdout
    assert r.stdout.rstrip().endswith("ok")
    # fsdp.sharding left at its default ('hybrid') on one node: its effect on the mesh line, no note
    # about a key the job never set
    default = tiny_job.read_text().replace('sharding = "full"\n', "")
    assert "sharding" not in default
    tiny_job.write_text(default)
    r = cli("validate", str(tiny_job))
    assert r.returncode == 0 and "mesh       2 (shard), sharding full ('hybrid' on 1 node), FSDP2" in r.stdout
    assert "note" not in r.stdout, r.stdout


def test_validate_for_the_local_executor_never_asks_slurm(tiny_job, tmp_path):
    """Issue 36: `validate` asked the controller (scontrol ping) on every call, so tests that check
    jobs for this machine waited on the devcluster while a Slurm test held or froze it. With
    `--executor local` it asks nothing (a recording scontrol first on PATH); `auto` still asks."""
    shims, log = tmp_path / "bin", tmp_path / "calls"
    shims.mkdir()
    for name in ("sbatch", "scontrol"):
        (shims / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\necho "Slurmctld(primary) at ctl is UP"\n')
        (shims / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"}
    env.pop("SLURM_CONF", None)
    run = [sys.executable, "-m", "clusterfsdp.cli", "validate", str(tiny_job)]
    local = subprocess.run([*run, "--executor", "local"], env=env, capture_output=True, text=True, timeout=120)
    assert local.returncode == 0 and "this machine (local executor)\n" in local.stdout, local.stdout + local.stderr
    assert not log.exists()
    auto = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120)
    assert auto.returncode == 0 and "Slurm (controller answers)" in auto.stdout, auto.stdout + auto.stderr
    assert log.read_text() == "scontrol ping\n"


def test_validate_bad_file_exit_2_with_field_errors_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[slurm]\ngpu_per_node = 2\nnodes = "x"\n')
    r = cli("validate", str(bad))
    assert r.returncode == 2
    assert f"error: {bad}: slurm.gpu_per_node: unknown key; did you mean gpus_per_node?" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["validate", "/nonexistent.toml"],
        ["status", "nope"],
        ["logs", "nope"],
        ["cancel", "nope"],
        ["resume", "nope"],
        ["export", "nope", "--to", "/tmp/x"],
    ],
)
def test_bad_input_is_exit_2_one_line(args, tmp_path):
    """Exactly one line, on stderr, naming what was given (the run id or the file)."""
    r = cli(*args, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    (line,) = r.stderr.splitlines()
    assert line.startswith("error: ") and args[1] in line, r.stderr


def test_set_overrides_reach_validate(tiny_job):
    r = cli("validate", str(tiny_job), "--set", "train.steps=7", "--set", "slurm.tasks_per_node=1")
    assert r.returncode == 0 and "7 steps" in r.stdout and "= 1 ranks" in r.stdout
    r = cli("validate", str(tiny_job), "--set", "train.steps=lots")
    assert r.returncode == 2 and "train.steps: expected integer, found string 'lots'" in r.stderr


def test_init_writes_a_valid_starter_and_refuses_to_overwrite(tmp_path):
    assert cli("init", str(tmp_path / "job.toml")).returncode == 0
    assert S.load(tmp_path / "job.toml") == S.with_absolute_paths(S.JobSpec(), tmp_path)
    r = cli("init", str(tmp_path / "job.toml"))
    assert r.returncode == 2 and "exists" in r.stderr


def test_schema_documents_keys():
    r = cli("schema", "slurm.gpus_per_node")
    assert (
        r.returncode == 0 and "gpus_per_node = 0    (integer)" in r.stdout and "one worker process per GPU" in r.stdout
    )


def test_local_multinode_is_refused_before_anything_is_created(tiny_job, tmp_path):
    r = cli("submit", str(tiny_job), "--executor", "local", "--set", "slurm.nodes=2")
    assert r.returncode == 2 and "local executor runs on one machine" in r.stderr
    assert not (tmp_path / "runs").exists()


def test_control_plane_does_not_import_torch(tiny_job, tmp_path):
    code = f"""
import sys
from clusterfsdp.cli import main
for argv in (["validate", {str(tiny_job)!r}], ["runs", "--run-root", {str(tmp_path)!r}],
             ["status", "--run-root", {str(tmp_path)!r}], ["schema"]):
    assert main(argv) == 0, argv
try:
    main(["--help"])
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "transformers", "textual") if m in sys.modules)
assert not heavy, heavy
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def _imported_by(argv: list[str], also: tuple[str, ...] = ()) -> tuple[set[str], int]:
    """The clusterfsdp modules (and those named in `also`) one command imports (in a fresh
    interpreter), and how many modules it imports in all beyond what the interpreter had loaded
    before it."""
    code = f"""
import sys, io, contextlib
before = set(sys.modules)
from clusterfsdp.cli import main
try:
    with contextlib.redirect_stdout(io.StringIO()):
        main({argv!r})
except SystemExit:
    pass
new = set(sys.modules) - before
print(" ".join(sorted(m for m in new if m.startswith("clusterfsdp") or m in {also!r})), len(new), sep="\\n")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    names, count = r.stdout.splitlines()
    return set(names.split()), int(count)


READ_ONLY = {
    "clusterfsdp", "clusterfsdp.cli", "clusterfsdp.core.term", "clusterfsdp.control", "clusterfsdp.core.records",
    "clusterfsdp.core.procs", "clusterfsdp.core.runfolder", "clusterfsdp.core.runroot",
    "clusterfsdp.control.jsonltail", "clusterfsdp.control.status", "clusterfsdp.core.slurmcli",
    "clusterfsdp.core.ckptfolder", "clusterfsdp.core.errors", "clusterfsdp.core.ownership",
    "clusterfsdp.core.fileio", "clusterfsdp.core.retrynotes", "clusterfsdp.core.slurmping",
    "clusterfsdp.core.value", "clusterfsdp.control.pending",  # a pending job's reason in words
    "clusterfsdp.control.cost",  # what each run cost (sacct, and the figures a run folder keeps)
    "clusterfsdp.cli.statuscmds",  # the CLI's group that shows runs' states (runs, status)
    "clusterfsdp.cli.dispatch", "clusterfsdp.cli.folders",  # runs a parsed command; finds run folders
    "clusterfsdp.control.jsonout", "clusterfsdp.control.strictjson",  # --json (no run service: issue 35)
    "clusterfsdp.core.benchresults", "clusterfsdp.core.numbers",  # benchmark scores, perplexity
    "clusterfsdp.data", "clusterfsdp.data.samplestats",  # status RUN's data.json reader (runs: the same group)
    "clusterfsdp.core", "clusterfsdp.core.budget", "clusterfsdp.core.sweeplayout",
}  # fmt: skip
RUN_IDS = {  # `runs --quiet` (shell completion): the run folders alone, nothing of control/
    "clusterfsdp", "clusterfsdp.cli", "clusterfsdp.cli.dispatch", "clusterfsdp.cli.folders", "clusterfsdp.core",
    "clusterfsdp.core.errors", "clusterfsdp.core.term", "clusterfsdp.core.retrynotes", "clusterfsdp.core.records",
    "clusterfsdp.core.procs", "clusterfsdp.core.runfolder", "clusterfsdp.core.runroot", "clusterfsdp.core.ownership",
    "clusterfsdp.core.fileio", "clusterfsdp.core.value",
}  # fmt: skip

VALIDATE = {
    "clusterfsdp", "clusterfsdp.cli", "clusterfsdp.core.term", "clusterfsdp.control", "clusterfsdp.core",
    "clusterfsdp.core.errors", "clusterfsdp.control.inputs", "clusterfsdp.control.summary",
    "clusterfsdp.core.modelsource",
    "clusterfsdp.core.hub", "clusterfsdp.core.presets", "clusterfsdp.core.slurmping",
    "clusterfsdp.core.retrynotes", "clusterfsdp.core.fileio",
    "clusterfsdp.core.runroot", "clusterfsdp.core.secretenv",
    "clusterfsdp.core.spec", "clusterfsdp.core.spec.allowlists", "clusterfsdp.core.spec.crossfield",
    "clusterfsdp.core.spec.codec", "clusterfsdp.core.spec.docs", "clusterfsdp.core.spec.paths",
    "clusterfsdp.core.spec.schema", "clusterfsdp.core.spec.tokenizer", "clusterfsdp.core.spec.badrecords",
    "clusterfsdp.core.spec.peft", "clusterfsdp.core.spec.templates", "clusterfsdp.core.value",
    "clusterfsdp.core.spec.nodes",
    "clusterfsdp.core.ownership",  # hub: a snapshot in a shared HF cache must be yours (issue 34)
    "clusterfsdp.core.spec.objective",  # train.objective's checks (issue 37)
    "clusterfsdp.core.spec.benchsection",  # [benchmarks] (issue 38; its files only for a job with tasks)
    "clusterfsdp.cli.validatecmd",  # the CLI's validate (its own module: the Slurm ping starts first)
    "clusterfsdp.cli.dispatch",  # runs a parsed command
    "clusterfsdp.core.spec.docfield", "clusterfsdp.core.spec.slurmsection",  # the schema's sections
    "clusterfsdp.core.spec.datasection", "clusterfsdp.core.spec.trainsection",
    "clusterfsdp.core.spec.outputsection",
    "clusterfsdp.core.spec.benchmetric",  # keep_best / early stopping on a benchmark score (issue 38)
}  # fmt: skip
DATA_CHECKS = {  # what validate adds for a job that reads files
    "clusterfsdp.data", "clusterfsdp.data.skipped", "clusterfsdp.data.fieldmap", "clusterfsdp.data.mixture",
    "clusterfsdp.data.cache", "clusterfsdp.data.checks", "clusterfsdp.data.formats", "clusterfsdp.data.overlap",
    "clusterfsdp.data.samplesets", "clusterfsdp.data.sources", "clusterfsdp.data.trust",
    "clusterfsdp.core.ownership",
    "clusterfsdp.data.unpaired",  # the 'unpaired' reader listed in data.fieldmap (issue 37's kto)
    "clusterfsdp.data.recordparts",  # what the readers of records share
    "clusterfsdp.data.kinds", "clusterfsdp.data.filekind",  # the kinds of source, one module each:
    "clusterfsdp.data.linefiles", "clusterfsdp.data.txtfile", "clusterfsdp.data.jsonlfile",  # their sniff
    "clusterfsdp.data.parquetfile", "clusterfsdp.data.hfdatasets",
}  # fmt: skip


def test_start_up_imports_only_what_each_command_needs(tmp_path):
    """Start-up is paid by every call, shell completion included (issue 25 item 3): counted in
    modules, not timed (bench/startup_bench.py times it). `--help` imports nothing of the control
    plane; `status` and `runs` read run folders without the spec's schema or the run service's
    submit machinery (launch, hub, modelsource, data.checks); `runs --quiet` (completion) not even
    status or Slurm."""
    from tui_helpers import make_run

    make_run(tmp_path, checkpoints=(20,), log_lines=1, ranks=1)
    root = ["--run-root", str(tmp_path)]
    names, count = _imported_by(["--help"])
    # (core/errors.py: the one error base every front-end catches; it imports nothing)
    help_only = {"clusterfsdp", "clusterfsdp.cli", "clusterfsdp.core", "clusterfsdp.core.errors"}
    assert names == help_only and count < 30, (names, count)
    names, _ = _imported_by(["status", "20260101-120000-aaaa", *root])
    assert names == READ_ONLY, names ^ READ_ONLY
    names, _ = _imported_by(["runs", *root])
    assert names == READ_ONLY, names ^ READ_ONLY
    names, _ = _imported_by(["runs", "--quiet", *root])
    assert names == RUN_IDS, names ^ RUN_IDS
    # validate: the spec, the source checks and the summary, not the run service (run, backends,
    # launch, lock, status) nor the run folder's records or Slurm's job table; synthetic tokens:
    # nothing of data/; no data file: xxhash and gzip are imported where a hash or a compressed
    # file needs them
    job = tmp_path / "job.toml"
    job.write_text(f'[job]\nname = "v"\nrun_root = "{tmp_path}"\n[data]\nsource = "synthetic"\n')
    names, count = _imported_by(["validate", str(job)], also=("xxhash", "gzip"))
    assert names == VALIDATE and count < 100, (names ^ VALIDATE, count)
    (tmp_path / "corpus.txt").write_text("one document of text, read by the checks\n" * 200)
    job.write_text(job.read_text().replace('"synthetic"', '"files"\npaths = ["corpus.txt"]\nseq_len = 64'))
    names, count = _imported_by(["validate", str(job)])
    assert names == VALIDATE | DATA_CHECKS, names ^ (VALIDATE | DATA_CHECKS)


def test_every_command_names_a_function_of_its_group():
    """Commands are registered by the name of their function ("<group>.<cmd_fn>", the group
    imported only when the command runs): a misspelt name would show only when that command
    runs, so every registered one (data's actions too) is resolved here."""
    import argparse
    import importlib

    from clusterfsdp.cli import build_parser

    def names(parser: argparse.ArgumentParser) -> list[str]:
        """The `fn` of every command that runs (a parser without sub-commands: data's actions), and
        its `sweep_fn` and `quiet_fn` where it has them (dispatch picks one)."""
        subs = [p for a in parser._actions if isinstance(a, argparse._SubParsersAction) for p in a.choices.values()]
        if subs:
            return [n for p in subs for n in names(p)]
        return [n for key in ("fn", "sweep_fn", "quiet_fn") if (n := parser.get_default(key))]

    found = names(build_parser())
    assert len(found) > 20 and {"statuscmds.cmd_status", "sweepview.cmd_status", "folders.cmd_run_ids"} <= set(found)
    for name in found:
        group, fn = name.split(".")
        assert callable(getattr(importlib.import_module(f"clusterfsdp.cli.{group}"), fn, None)), name


def test_rm_removes_finished_and_prepared_runs_and_refuses_live_and_foreign_ones(tmp_path, capsys):
    """`rm` through the run service (Run.remove): a finished run goes with its checkpoints, kept
    outside the run folder by checkpoint.dir; `--prepared` takes the dry runs never submitted; a
    run whose local attempt still runs (a real process group) and a run folder another user owns
    (chowned to nobody: the suite runs as root) are refused, and stay."""
    import os
    import signal

    from tui_helpers import make_run

    from clusterfsdp.cli import main
    from clusterfsdp.core import procs
    from clusterfsdp.core.records import RunRecord

    done = make_run(tmp_path, "20260101-120000-done")
    outside = tmp_path / "ckpt" / done.id
    (outside / "step-00000040").mkdir(parents=True)
    spec = done.spec()
    spec.checkpoint.dir = str(outside.parent)
    done.job_toml.write_text(S.dumps(spec))
    assert done.checkpoints_dir() == outside
    prepared = make_run(tmp_path, "20260101-120001-prep")
    prepared.write_record(RunRecord(prepared.id, prepared.name, prepared.record().executor, 1.0, dry_run=True))
    live = make_run(tmp_path, "20260101-120002-live")
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    foreign = make_run(tmp_path, "20260101-120003-them")
    try:
        live.update_attempt("1001", leader=procs.ProcessId.of(sleeper.pid))
        os.chown(foreign.path, 65534, 65534)
        root = ["--run-root", str(tmp_path)]
        assert main(["rm", done.id, *root]) == 0
        assert not done.path.exists() and not outside.exists() and outside.parent.exists()
        assert main(["rm", "--prepared", *root]) == 0 and not prepared.path.exists()
        assert main(["rm", live.id, foreign.id, *root]) == 2
        err = capsys.readouterr().err
        assert f"run {live.id} has a live attempt (local job 1001); cancel it first" in err
        assert f"run {foreign.id}: {foreign.path} belongs to another user (uid 65534); not removed" in err
        assert live.state_file.exists() and foreign.state_file.exists()
        assert main(["rm", *root]) == 2 and "nothing to remove" in capsys.readouterr().err
    finally:
        os.killpg(sleeper.pid, signal.SIGKILL)
        sleeper.wait()


def test_a_run_is_found_under_the_run_root_a_job_file_here_sets(tmp_path):
    """`submit job.toml` puts runs under the file's job.run_root; from the same folder status,
    doctor, logs and runs look there too (no --run-root, nothing configured to point there)."""
    from tui_helpers import make_run

    (tmp_path / "job.toml").write_text('[job]\nname = "tiny-cpu"\nrun_root = "elsewhere/runs"\n')
    (tmp_path / "notes.toml").write_text("not = [toml\n")  # other .toml files are passed over
    run = make_run(tmp_path / "elsewhere" / "runs")
    for args, said in (
        (["status", "20260101"], f"folder     {run.path}"),
        (["doctor", "20260101"], "run        20260101-120000-aaaa"),
        (["logs", "20260101", "-n", "1"], "[rank0] line 29"),
        (["runs"], "20260101-120000-aaaa"),
    ):
        r = cli(*args, cwd=tmp_path)
        assert r.returncode == 0 and said in r.stdout, (args, r.stdout, r.stderr)
    r = cli("status", "20270101", cwd=tmp_path)
    assert r.returncode == 2 and f"under {tmp_path / 'runs'} or {tmp_path / 'elsewhere' / 'runs'} (" in r.stderr
