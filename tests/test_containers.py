"""[slurm.container]: the workers started inside pyxis/enroot, Apptainer or Slurm's own OCI
containers, by the image's Python.

pyxis (a SPANK plugin built against the cluster's own Slurm, with enroot's helpers) and Apptainer
(not packaged by Debian 12) cannot be installed here, so their part is golden text of the rendered
script plus the script run by bash with `srun`/`apptainer` replaced by stubs that record their argv
(the shell semantics, for real). Slurm's OCI support runs for real on the devcluster
(tests/test_slurm_oci.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from clusterfsdp.control import launch
from clusterfsdp.control.run import Run
from clusterfsdp.core import runfolder
from clusterfsdp.core import spec as S
from clusterfsdp.core.records import Executor

GOLDEN = Path(__file__).parent / "golden"
JOB = """
[job]
name = "llm"
run_root = "RUNROOT"
[slurm]
partition = "gpu"
nodes = 2
gpus_per_node = 4
time = 60
"""
PYXIS = """[slurm.container]
kind = "pyxis"
image = "nvcr.io#nvidia/pytorch:24.05-py3"
python = "/opt/venv/bin/python"
mounts = ["/shared/data:/data:ro", "/scratch/x+y@z%1=~a:/scratch"]
workdir = "/shared/proj"
options = ["--no-container-mount-home"]
"""
APPTAINER = """[slurm.container]
kind = "apptainer"
image = "/shared/images/torch.sif"
mounts = ["/shared/data:/data:ro"]
workdir = "/shared/proj"
options = ["--cleanenv"]
"""
OCI = """[slurm.container]
kind = "oci"
image = "/shared/oci/torch"
python = "/usr/bin/python3"
"""


def render(tmp_path: Path, job: str) -> tuple[str, runfolder.RunFolder]:
    spec = S.loads(job.replace("RUNROOT", str(tmp_path / "runs")))
    run = runfolder.create_run(spec, Executor.SLURM, run_id="RUNID")
    return launch.render_sbatch(spec, run), run


def golden(name: str, script: str, tmp_path: Path) -> str:
    text = script.replace(str(tmp_path), "<TMP>").replace(sys.executable, "<PYTHON>")
    if os.environ.get("UPDATE_GOLDEN"):
        (GOLDEN / name).write_text(text)
    assert text == (GOLDEN / name).read_text()
    return text


def stub(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(exist_ok=True)
    path = bindir / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def run_script(script: str, tmp_path: Path, *tools: str) -> dict[str, list[str]]:
    """Run the sbatch script with bash, each of `tools` a stub writing its argv to <tmp>/<tool>.argv.
    The job steps around srun run for real (this Python, on the host), as in a first incarnation."""
    bindir = tmp_path / "bin"
    for tool in tools:
        stub(bindir, tool, f'printf "%s\\n" "$@" > {tmp_path}/{tool}.argv')
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7"}
    subprocess.run(["bash", "-c", script], env=env, check=True, cwd=tmp_path)
    return {t: (tmp_path / f"{t}.argv").read_text().splitlines() for t in tools if (tmp_path / f"{t}.argv").exists()}


def test_pyxis_golden_script_and_argv(tmp_path):
    """pyxis cannot be installed here (a SPANK plugin for the cluster's own Slurm build, plus
    enroot): the rendered script is golden, and bash runs it with a stub srun recording its argv."""
    script, run = render(tmp_path, JOB + PYXIS)
    golden("sbatch_pyxis.sh", script, tmp_path)
    argv = run_script(script, tmp_path, "srun")["srun"]
    runs = str(tmp_path / "runs")
    assert argv[argv.index("--container-image=nvcr.io#nvidia/pytorch:24.05-py3") :] == [
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
        f"--container-mounts={runs}:{runs},/shared/data:/data:ro,/scratch/x+y@z%1=~a:/scratch",
        "--container-workdir=/shared/proj",
        "--no-container-mount-home",
        "/opt/venv/bin/python",
        "-u",
        "-m",
        "submitit.core._submit",
        str(run.submitit_dir),
    ]


def test_apptainer_golden_script_and_argv(tmp_path):
    """Apptainer is not packaged for Debian 12 and cannot be installed here: the rendered script is
    golden, and bash runs it with stub srun and apptainer commands recording their argv."""
    script, run = render(tmp_path, JOB + APPTAINER)
    golden("sbatch_apptainer.sh", script, tmp_path)
    argv = run_script(script, tmp_path, "srun")["srun"]
    runs = str(tmp_path / "runs")
    assert argv[argv.index("apptainer") :] == [
        "apptainer", "exec", "--nv", "--bind", f"{runs}:{runs},/shared/data:/data:ro", "--pwd", "/shared/proj",
        "--cleanenv", "/shared/images/torch.sif", "python3", "-u", "-m", "submitit.core._submit", str(run.submitit_dir),
    ]  # fmt: skip


def test_oci_runs_the_bundles_python_through_srun_container(tmp_path):
    script, run = render(tmp_path, JOB.replace("gpus_per_node = 4", "gpus_per_node = 1") + OCI)
    argv = run_script(script, tmp_path, "srun")["srun"]
    assert argv[argv.index("--container=/shared/oci/torch") :] == [
        "--container=/shared/oci/torch", "/usr/bin/python3", "-u", "-m", "clusterfsdp.worker.ocitask",
        "-u", "-m", "submitit.core._submit", str(run.submitit_dir),
    ]  # fmt: skip


def test_submit_queues_the_same_script_the_image_runs_the_ranks_the_host_the_job_steps(tmp_path, monkeypatch):
    """The submit path (not the dry run), through stub `sbatch` and `scontrol` commands (no Slurm
    here) that keep the script and answer as Slurm does: the ranks start in the container with
    the image's Python, the job steps around srun with this one (they run on the batch host)."""
    bindir = tmp_path / "bin"
    stub(bindir, "scontrol", 'echo "Slurmctld(primary) at head is UP"')
    stub(bindir, "srun", "exit 0")
    keep = f'cp "${{@: -1}}" {tmp_path}/submitted.sh'  # the script is sbatch's last argument
    stub(bindir, "sbatch", f'[ "$1" = --version ] && echo "slurm 22.05.8" && exit\n{keep}\necho 4242')
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    spec = S.loads((JOB + PYXIS).replace("RUNROOT", str(tmp_path / "runs")))
    sub = Run.submit(spec, "slurm")
    assert sub.job_id == "4242" and sub.run.folder.attempts[0].executor == "slurm"
    script = (tmp_path / "submitted.sh").read_text()
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--container-image=nvcr.io#nvidia/pytorch:24.05-py3" in srun
    assert srun.endswith(f" /opt/venv/bin/python -u -m submitit.core._submit {sub.run.folder.submitit_dir}/%j")
    assert f"PY={sys.executable}" in script and '"$PY" -m clusterfsdp.control.jobstep after "$RUN" "$?"' in script


@pytest.mark.parametrize(
    "table,error",
    [
        ('kind = "pyxis"', "slurm.container.image: kind = 'pyxis' needs an image"),
        ('kind = "pyxis"\nimage = "a b"', "slurm.container.image: 'a b' must be letters"),
        ('kind = "pyxis"\nimage = "x\'$(touch PWNED)"', "slurm.container.image: "),
        ('kind = "apptainer"\nimage = "/i.sif"\npython = "python3 -c 1"', "slurm.container.python: "),
        ('kind = "pyxis"\nimage = "i"\nmounts = ["/a:/b,/etc:/x"]', "slurm.container.mounts[0]: "),
        ('kind = "pyxis"\nimage = "i"\nmounts = ["relative:/b"]', "slurm.container.mounts[0]: "),
        ('kind = "pyxis"\nimage = "i"\nworkdir = "w d"', "slurm.container.workdir: "),
        ('kind = "pyxis"\nimage = "i"\noptions = ["--x; rm -rf ~"]', "slurm.container.options[0]: "),
        ('kind = "oci"\nimage = "relative/bundle"', "slurm.container.image: 'relative/bundle' must be an absolute"),
        ('kind = "oci"\nimage = "/b"\nmounts = ["/a:/a"]', "slurm.container.mounts: not used with kind = 'oci'"),
        ('image = "nvcr.io#x"', "slurm.container.image: set slurm.container.kind to run in a container"),
        ('kind = "docker"', "slurm.container.kind: expected one of 'none' | 'pyxis' | 'apptainer' | 'oci'"),
        ('imag = "x"', "slurm.container.imag: unknown key; did you mean image?"),
    ],
)
def test_container_values_are_checked_with_the_key_named(table, error):
    with pytest.raises(S.SpecError) as e:
        S.loads(f"[slurm.container]\n{table}\n")
    assert any(line.startswith(error) for line in e.value.errors), e.value.errors


def test_containers_need_slurm_and_oci_on_22_05_one_task_per_node(tmp_path, monkeypatch):
    spec = S.loads((JOB + OCI).replace("RUNROOT", str(tmp_path / "runs")))
    with pytest.raises(launch.SubmitError, match="the local executor runs this machine's Python"):
        launch.check_container(spec, Executor.LOCAL)
    stub(tmp_path / "bin", "sbatch", 'echo "slurm 22.05.8"')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    with pytest.raises(launch.SubmitError, match=r"Slurm 22.05 runs one task per node .* has 4 per node"):
        launch.check_container(spec, Executor.SLURM)
    launch.check_container(S.loads((JOB + OCI).replace("gpus_per_node = 4", "gpus_per_node = 1")), Executor.SLURM)


def test_set_reaches_nested_container_keys_typed_by_the_schema():
    spec = S.loads("", ["slurm.container.kind=apptainer", "slurm.container.image=/i.sif", "slurm.container.python=3"])
    assert (spec.slurm.container.kind, spec.slurm.container.python) == ("apptainer", "3")
    assert S.loads(S.dumps(spec)) == spec  # the nested table round-trips through job.toml


def test_notebook_srun_steps_start_the_images_python_too(tmp_path):
    from clusterfsdp.notebook.placement import srun_command

    spec = S.loads((JOB + PYXIS).replace("RUNROOT", str(tmp_path / "runs")))
    cmd = srun_command(spec, tmp_path / "run", step_name="s")
    python = cmd.index("/opt/venv/bin/python")
    assert "--container-image=nvcr.io#nvidia/pytorch:24.05-py3" in cmd[:python]
    assert cmd[python:] == [
        "/opt/venv/bin/python",
        "-u",
        "-m",
        "clusterfsdp.notebook.tasks",
        "_task",
        str(tmp_path / "run"),
    ]


def test_data_that_exists_only_in_the_image_is_left_to_the_job(tmp_path):
    """A container job's data path that is not on the submitting host may be inside the image:
    validate notes it and submit does not refuse it (prepare checks it inside the container);
    the same path without a container is refused, naming the key."""
    from clusterfsdp.data import checks

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text " * 2000)
    data = f'[data]\nsource = "files"\npaths = ["/in-image/corpus.txt", "{corpus}"]\n'
    spec = S.loads(data + PYXIS)
    assert checks.container_only_paths(spec) == ["/in-image/corpus.txt"]
    assert checks.problems(spec) == []
    plain = S.loads(data)
    assert checks.container_only_paths(plain) == []
    assert any(e.startswith("data.paths[0]: '/in-image/corpus.txt'") for e in checks.problems(plain))
