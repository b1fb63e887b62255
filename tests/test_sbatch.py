"""sbatch rendering: golden text, and job.toml values can never run as shell code."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from clusterfsdp.control import launch, runfolder
from clusterfsdp.control import spec as S
from clusterfsdp.control.records import Executor
from clusterfsdp.control.run import Run

GOLDEN = Path(__file__).parent / "golden" / "sbatch_2node.sh"
JOB = """
[job]
name = "llm"
run_root = "RUNROOT"
[slurm]
partition = "gpu"
account = "proj"
nodes = 2
gpus_per_node = 4
cpus_per_task = 8
mem_gb = 64
time = "0-02:00:00"
constraint = "h100&ib"
signal_grace_s = 180
extra = { reservation = "big", "gres-flags" = "enforce-binding" }
setup = ["module load cuda/12.4"]
"""


def render(tmp_path: Path, job: str) -> tuple[str, runfolder.RunFolder]:
    spec = S.loads(job.replace("RUNROOT", str(tmp_path / "runs")))
    run = runfolder.create_run(spec, Executor.SLURM, run_id="RUNID")
    return launch.render_sbatch(spec, run), run


def normalize(script: str, tmp_path: Path) -> str:
    return script.replace(str(tmp_path), "<TMP>").replace(sys.executable, "<PYTHON>")


def test_golden_two_node_script(tmp_path):
    script, _ = render(tmp_path, JOB)
    text = normalize(script, tmp_path)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    for line in [
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --requeue",
        "#SBATCH --signal=USR2@180",
        "#SBATCH --time=120",
        "#SBATCH --mem=65536M",
        "#SBATCH --reservation=big",
    ]:
        assert line in text


def test_requeue_false_renders_no_requeue(tmp_path):
    script, _ = render(tmp_path, JOB + "requeue = false\n")
    assert "#SBATCH --no-requeue" in script and "#SBATCH --requeue" not in script


# The injection found in the issue: Slurm's #SBATCH parser honours backslashes inside quotes, so
# this partition (TOML: "gpu\\'x\" --chdir=/tmp/X --comment=X #") smuggled --chdir and --comment in.
INJECTIONS = [
    ("partition", "gpu\\'x\" --chdir=/tmp/X --comment=X #"),
    ("partition", "gpu\ntouch PWNED"),
    ("account", "a b"),
    ("account", "a\rb"),
    ("qos", "normal;touch PWNED"),
    ("constraint", "x\x00"),
    ("constraint", "h100 --chdir=/"),
    ("extra.comment", '"x" --chdir=/tmp'),
    ("extra.comment", "$(touch PWNED)"),
    ("extra.mail-user", "me@x.org`id`"),
]


@pytest.mark.parametrize("key,value", INJECTIONS)
def test_values_outside_the_sbatch_allowlist_are_refused_with_the_key_named(key, value):
    literal = tomli_w.dumps({"v": value}).strip().removeprefix("v = ")
    name = key.removeprefix("extra.")
    text = f"[slurm]\nextra = {{ {name} = {literal} }}\n" if key != name else f"[slurm]\n{name} = {literal}\n"
    with pytest.raises(S.SpecError) as e:
        S.loads(text)
    refused = ("may only contain", "contains a NUL character")  # NUL: refused for every string, before the allowlist
    assert any(err.startswith(f"slurm.{key}: ") and any(r in err for r in refused) for err in e.value.errors), e.value


def test_an_extra_option_name_outside_the_allowlist_is_refused():
    with pytest.raises(S.SpecError, match=r"slurm\.extra\.Chdir X: not an sbatch option name"):
        S.loads('[slurm]\nextra = { "Chdir X" = "y" }\n')


def test_run_root_with_shell_characters_is_refused(tmp_path):
    spec = S.loads(f'[job]\nrun_root = "{tmp_path}/$(touch PWNED)"\n')
    with pytest.raises(launch.SubmitError, match="run_root"):
        Run.prepare(spec)
    assert not list(tmp_path.rglob("PWNED"))


def test_allowed_special_characters_do_not_execute(tmp_path):
    """Runs the rendered script with bash, with `srun` on PATH replaced by a stub that records its
    argv (the boundary: no Slurm needed to check the shell semantics of the script). Every
    character the allowlist lets through that means something to a shell (& | * ( ) [ ] : = @ %)
    is in a value here; tests/test_slurm_e2e.py (test_sbatch_parses_every_allowlisted_value_as_rendered)
    sends values with the same characters through `submit --dry-run` and the real sbatch's parser."""
    marker = tmp_path / "PWNED"
    job = JOB.replace('"h100&ib"', '"(h100&ib)|[a100*2]"').replace(
        'reservation = "big"', 'reservation = "big", exclude = "node[3-4]", "mail-user" = "me@x.org%"'
    )
    script, run = render(tmp_path, job)
    assert "#SBATCH --constraint='(h100&ib)|[a100*2]'" in script  # quoted; Slurm's parser unquotes
    assert "#SBATCH --exclude='node[3-4]'" in script
    bindir = tmp_path / "bin"
    bindir.mkdir()
    stub = bindir / "srun"
    stub.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SRUN_ARGS": str(tmp_path / "argv")}
    env.update(SLURM_JOB_ID="1", SLURM_JOB_NODELIST="node1")  # for the control plane's job steps around srun
    body = script.replace("module load cuda/12.4", "true")
    subprocess.run(["bash", "-c", body], env=env, check=True, cwd=tmp_path)
    assert not marker.exists()
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[-3:] == ["-m", "clusterfsdp.worker", str(run.path)]


def test_dry_run_prepares_a_run_folder_and_writes_the_script(tmp_path):
    spec = S.loads(JOB.replace("RUNROOT", str(tmp_path / "runs")))
    run, script = Run.prepare(spec)
    assert (run.path / "sbatch.sh").read_text() == script
    assert run.folder.attempts == [] and run.folder.record().dry_run and S.load(run.folder.job_toml) == spec
