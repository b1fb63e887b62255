"""sbatch rendering: golden text, and job.toml values can never run as shell code."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from clusterfsdp.control import launch, runfolder
from clusterfsdp.control import spec as S

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
    run = runfolder.create_run(spec, "slurm", run_id="RUNID")
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


@pytest.mark.parametrize(
    "key,value", [("partition", "gpu\\ntouch PWNED"), ("account", "a\\rb"), ("constraint", "x\\u0000")]
)
def test_control_characters_are_refused(tmp_path, key, value):
    spec = S.loads(f'[slurm]\n{key} = "{value}"\n')
    with pytest.raises(launch.SubmitError, match="control characters"):
        launch.slurm_parameters(spec)


def test_run_root_with_shell_characters_is_refused(tmp_path):
    spec = S.loads(f'[job]\nrun_root = "{tmp_path}/$(touch PWNED)"\n')
    with pytest.raises(launch.SubmitError, match="run_root"):
        launch.dry_run(spec)
    assert not list(tmp_path.rglob("PWNED"))


def test_metacharacters_in_values_do_not_execute(tmp_path):
    """Runs the rendered script with bash, with `srun` on PATH replaced by a stub that records its
    argv (the boundary: no Slurm needed to check the shell semantics of the script)."""
    marker = tmp_path / "PWNED"
    job = JOB.replace('"gpu"', f'"gpu$(touch {marker})`touch {marker}`;touch {marker}"')
    job = job.replace('"proj"', f"\"'; touch {marker}; echo '\"")
    script, run = render(tmp_path, job)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    stub = bindir / "srun"
    stub.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "module").write_text("")  # the setup line `module load ...` must find something harmless
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SRUN_ARGS": str(tmp_path / "argv")}
    body = script.replace("module load cuda/12.4", "true")
    subprocess.run(["bash", "-c", body], env=env, check=True, cwd=tmp_path)
    assert not marker.exists()
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[-3:] == ["-m", "clusterfsdp.worker", str(run.path)]


def test_dry_run_prepares_a_run_folder_and_writes_the_script(tmp_path):
    spec = S.loads(JOB.replace("RUNROOT", str(tmp_path / "runs")))
    run, script = launch.dry_run(spec)
    assert (run.path / "sbatch.sh").read_text() == script
    assert run.attempts == [] and S.load(run.job_toml) == spec
