"""clusterfsdp.notebook: job resolution, launcher choice, the srun line and its environment (unit
tests), and real notebooks executed by nbclient on a real ipykernel: the local fallback with
live rank-prefixed output and the progress display, the magics, the stop button, and the
outside-allocation error. The allocation tests are in test_notebook_slurm.py.

This file is also the notebook runner those tests start under `salloc` (the kernel must inherit
the allocation's environment):

    python tests/test_notebook.py NOTEBOOK_IN NOTEBOOK_OUT REPORT_JSON [--interrupt CELL REGEX]
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- the notebook runner
def make_notebook(cells: list[str | tuple[str, list[str]]]):
    """A notebook of code cells; a (source, tags) pair tags a cell (e.g. 'raises-exception')."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for cell in cells:
        source, tags = (cell, []) if isinstance(cell, str) else cell
        c = nbformat.v4.new_code_cell(source)
        if tags:
            c.metadata["tags"] = tags
        nb.cells.append(c)
    return nb


def _processes_matching(text: str) -> list[str]:
    """Command lines (not zombies) that contain `text`: processes of a run that outlived it."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state not in ("Z", "X") and int(proc.name) != os.getpid():
            found.append(f"{proc.name} {cmdline.strip()}")
    return found


def run_notebook(
    nb, cwd: Path, env: dict[str, str], *, interrupt: tuple[int, str] | None = None, timeout: int = 420
) -> tuple[Any, dict]:
    """Execute `nb` in a fresh python3 kernel started with `env` in `cwd`. With `interrupt=(cell,
    regex)`, press the stop button (KernelManager.interrupt_kernel: SIGINT to the kernel's process
    group, as Jupyter does) once that cell's output matches. Returns (executed notebook, report)."""
    from nbclient import NotebookClient

    report: dict = {"cell_done": {}, "interrupted_at": None}

    class Client(NotebookClient):
        def output(self, outs, msg, display_id, cell_index):
            if (
                interrupt
                and report["interrupted_at"] is None
                and cell_index == interrupt[0]
                and msg["msg_type"] == "stream"
            ):
                report.setdefault("seen", "")
                report["seen"] += msg["content"].get("text", "")
                if re.search(interrupt[1], report["seen"]):
                    report["interrupted_at"] = time.time()
                    assert self.km is not None  # (started by execute)
                    report["interrupt"] = asyncio.ensure_future(self.km.interrupt_kernel())  # pyright: ignore[reportArgumentType, reportCallIssue]  (async at run time)
            return super().output(outs, msg, display_id, cell_index)

    def executed(cell, cell_index, execute_reply):
        report["cell_done"][cell_index] = time.time()
        if interrupt and cell_index == interrupt[0]:
            # right after the interrupted cell returned: what is left of the run?
            text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
            m = re.search(r"run folder (\S+)", text)
            report["run_dir"] = m.group(1) if m else None
            report["procs_after"] = _processes_matching(m.group(1)) if m else None
            if os.environ.get("SLURM_JOB_ID") and shutil.which("squeue"):
                report["squeue_steps_after"] = subprocess.run(
                    ["squeue", "--steps", "-h", "-j", os.environ["SLURM_JOB_ID"], "-o", "%i|%j"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                ).stdout

    client = Client(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd)}},
        on_cell_executed=executed,
    )
    t0 = time.time()
    client.execute(env=env)
    report["total_s"] = time.time() - t0
    if interrupt is not None and report["interrupted_at"] is not None:
        report["interrupt_to_cell_done_s"] = report["cell_done"][interrupt[0]] - report["interrupted_at"]
    return nb, report


def stream_text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


def errors(cell) -> list[dict]:
    return [o for o in cell.outputs if o.get("output_type") == "error"]


def displays(cell) -> list[dict]:
    return [o for o in cell.outputs if o.get("output_type") in ("display_data", "execute_result")]


def json_line(cell, tag: str = "RESULT") -> dict:
    """The JSON a cell printed on a line starting with `tag `."""
    for line in stream_text(cell).splitlines():
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1 :])
    raise AssertionError(f"no {tag} line in:\n{stream_text(cell)}")


RESULT_CELL = """
import json
from clusterfsdp import notebook as _nb
_r = _nb.last_result()
print("RESULT " + json.dumps({"status": _r.status, "job_id": _r.job_id, "step": _r.step, "launcher": _r.launcher,
      "exit_codes": {str(k): v for k, v in _r.exit_codes.items()}, "hosts": {str(k): v for k, v in _r.hosts.items()},
      "checkpoint": str(_r.checkpoint) if _r.checkpoint else None, "run_dir": str(_r.run_dir),
      "steps": [m["step"] for m in _r.metrics], "final": _r.final_metrics, "message": _r.message,
      "elapsed_s": _r.elapsed_s}))
"""


def kernel_env(**extra: str) -> dict[str, str]:
    """This process's environment without any Slurm/launcher variables (conftest scrubs them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SRUN_", "SALLOC_", "SUBMITIT_"))}
    env.update(extra)
    return env


def no_slurm_env(tmp_path: Path, *, missing_conf: bool = False, **extra: str) -> dict[str, str]:
    """A machine without Slurm: the client commands find an empty configuration, so no controller
    answers and `scontrol ping` fails at once (the packages are installed here; the decision must
    not be made by PATH). With `missing_conf`, SLURM_CONF names a file that does not exist:
    scontrol would wait for it (Slurm retries for up to 60 s), so the launcher does not ask it
    (slurmping.Ping): the same decision, reached without scontrol."""
    conf = tmp_path / "no-slurm" / "slurm.conf"
    if not missing_conf:
        conf.parent.mkdir(exist_ok=True)
        conf.write_text("")
    return kernel_env(SLURM_CONF=str(conf), **extra)


def fake_controller_env(tmp_path: Path) -> dict[str, str]:
    """A machine where a Slurm controller answers (fake sbatch/scontrol first on PATH), outside any allocation."""
    bin_dir = tmp_path / "fake-slurm-bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (("scontrol", 'echo "Slurmctld(primary) at ctl is UP"'), ("sbatch", "exit 1")):
        p = bin_dir / name
        p.write_text(f"#!/bin/sh\n{body}\n")
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return kernel_env(PATH=f"{bin_dir}:{os.environ['PATH']}")


# ---------------------------------------------------------------- unit tests (no processes)
def test_load_job_from_path_text_spec_and_overrides(tiny_job, tmp_path, monkeypatch):
    from clusterfsdp import notebook
    from clusterfsdp.core import spec as specmod

    a = notebook.load_job(str(tiny_job), ["train.steps=7"])
    assert a.train.steps == 7 and a.job.run_root == str(tmp_path / "runs")
    b = notebook.load_job(
        tiny_job, {"train.lr": 1e-3, "slurm.partition": "gpu", "model.from_config": {"num_hidden_layers": 1}}
    )
    assert b.train.lr == 1e-3 and b.slurm.partition == "gpu" and b.model.from_config == {"num_hidden_layers": 1}
    monkeypatch.chdir(tmp_path)
    c = notebook.load_job('[job]\nname = "t"\nrun_root = "rr"\n[train]\nsteps = 3\n', overrides="train.log_every=1")
    assert c.train.steps == 3 and c.train.log_every == 1 and c.job.run_root == str(tmp_path / "rr")
    d = notebook.load_job(a, ["slurm.nodes=2"])
    assert d.slurm.nodes == 2 and d.train.steps == 7 and a.slurm.nodes == 1
    with pytest.raises(specmod.SpecError, match="no such file"):
        notebook.load_job("missing.toml")
    with pytest.raises(specmod.SpecError, match=r"train\.stepz"):
        notebook.load_job(tiny_job, ["train.stepz=3"])


def test_layout_overrides_are_written_into_the_spec(tiny_job):
    from clusterfsdp import notebook
    from clusterfsdp.core import spec as specmod

    s = notebook.with_layout(notebook.load_job(tiny_job), nodes=2, gpus_per_node=4)
    assert (s.slurm.nodes, s.slurm.gpus_per_node, s.tasks_per_node, s.world_size) == (2, 4, 4, 8)
    assert s.mesh_shape == (8,)  # the workers build their mesh from this spec (tiny-cpu: full sharding)
    assert notebook.with_layout(notebook.load_job(tiny_job), tasks_per_node=3).world_size == 3
    with pytest.raises(specmod.SpecError):
        notebook.with_layout(notebook.load_job(tiny_job), nodes=0)


def test_launcher_choice(tmp_path, monkeypatch):
    from clusterfsdp import notebook
    from clusterfsdp.core import slurmcli

    with_srun = tmp_path / "bin"
    with_srun.mkdir()
    (with_srun / "srun").write_text("#!/bin/sh\n")
    (with_srun / "srun").chmod(0o755)
    empty = tmp_path / "empty"
    empty.mkdir()
    mode, notice = notebook.choose_launcher(
        "auto", {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[1-2]", "PATH": str(with_srun)}
    )
    assert mode == "srun" and "allocation 77" in notice and "node[1-2]" in notice
    with pytest.raises(notebook.SrunError, match="no `srun` on PATH"):
        notebook.choose_launcher("auto", {"SLURM_JOB_ID": "77", "PATH": str(empty)})
    assert notebook.choose_launcher("local", {"SLURM_JOB_ID": "77", "PATH": str(with_srun)})[0] == "local"
    # outside an allocation, srun on PATH alone decides nothing: a controller must answer
    monkeypatch.setattr(slurmcli, "available", lambda: False)
    mode, notice = notebook.choose_launcher("auto", {"PATH": str(with_srun)})
    assert mode == "local" and "no Slurm allocation" in notice
    with pytest.raises(notebook.NotInAllocation, match="salloc"):
        notebook.choose_launcher("srun", {"PATH": str(with_srun)})
    monkeypatch.setattr(slurmcli, "available", lambda: True)
    with pytest.raises(notebook.NotInAllocation) as e:
        notebook.choose_launcher("auto", {"PATH": str(with_srun)})
    assert "salloc" in str(e.value) and "clusterfsdp.submit(" in str(e.value)
    assert e.value._render_traceback_()[0].startswith("NotInAllocation: not inside a Slurm allocation")


def test_a_notebook_launch_goes_through_the_run_service_checks(tiny_job, tmp_path):
    """The notebook is no second run service: `srun` runs the same source preparation as
    `clusterfsdp submit` (`Run.srun`: hub resolution, then the data check). A data file too small
    for one batch is refused before any rank starts or any run folder is made, with the same
    SpecError as submit, which IPython shows without a traceback (every UserError does)."""
    import io

    from clusterfsdp import notebook
    from clusterfsdp.core import runfolder
    from clusterfsdp.core import spec as specmod

    small = tmp_path / "bad.jsonl"
    small.write_text("not json\n")
    out = io.StringIO()
    with pytest.raises(specmod.SpecError) as e:
        notebook.srun(str(tiny_job), launcher="local", progress=False, overrides={"data.paths": [str(small)]}, out=out)
    assert any(str(small) in line and "not valid JSON" in line for line in e.value.errors), e.value.errors
    assert e.value._render_traceback_()[0].startswith("SpecError: ")
    assert runfolder.list_runs(tmp_path / "runs") == []
    assert "launcher: local processes" in out.getvalue() and "[local]" not in out.getvalue()  # nothing started


def test_srun_line_restates_resources_and_env_is_scrubbed(tiny_job, tmp_path):
    from clusterfsdp import notebook

    spec = notebook.with_layout(
        notebook.load_job(
            tiny_job,
            {"slurm.cpus_per_task": 3, "slurm.mem_gb": 1.5, "env.HF_TOKEN": "s3cret", "env.NCCL_DEBUG": "INFO"},
        ),
        nodes=2,
        gpus_per_node=2,
    )
    cmd = notebook.srun_command(
        spec, tmp_path / "run", step_name="clusterfsdp-nb-x", overlap=True, srun_args=["--nodelist=node[1-2]"]
    )
    assert cmd[0] == "srun"
    for opt in (
        "--job-name=clusterfsdp-nb-x",
        "--nodes=2",
        "--ntasks=4",
        "--ntasks-per-node=2",
        "--gpus-per-node=2",
        "--cpus-per-task=3",
        "--mem=1536M",
        "--overlap",
        "--label",
        "--kill-on-bad-exit=1",
        "--distribution=block",
        "--export=ALL",
        "--nodelist=node[1-2]",
    ):
        assert opt in cmd, opt
    assert cmd[-5:] == ["-u", "-m", "clusterfsdp.notebook.tasks", "_task", str(tmp_path / "run")]
    assert "--overlap" not in notebook.srun_command(spec, tmp_path, step_name="s")

    inherited = {
        "SLURM_JOB_ID": "77",
        "SLURM_JOBID": "77",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SLURM_NTASKS": "8",
        "SLURM_NPROCS": "8",
        "SLURM_CPUS_PER_TASK": "8",
        "SLURM_MEM_PER_CPU": "100",
        "SLURM_TRES_PER_TASK": "cpu:8",
        "SLURM_GPUS_PER_NODE": "4",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_DISTRIBUTION": "cyclic",
        "SRUN_CPUS_PER_TASK": "8",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "MASTER_PORT": "1234",
        "RANK": "3",
        "HOME": "/root",
        "PATH": "/bin",
    }
    env = notebook.launcher_env("srun", spec, inherited)
    assert {k for k in env if k.startswith(("SLURM_", "SRUN_"))} == {"SLURM_JOB_ID", "SLURM_JOBID", "SLURM_CONF"}
    assert "MASTER_PORT" not in env and "RANK" not in env and env["HOME"] == "/root"
    assert env["HF_TOKEN"] == "s3cret"  # secrets travel in the environment ...
    assert "NCCL_DEBUG" not in env  # ... the rest of [env] in the run folder's job.toml
    assert notebook.ENV_LOG_ALL_RANKS not in env
    assert notebook.launcher_env("srun", spec, inherited, all_ranks=True)[notebook.ENV_LOG_ALL_RANKS] == "1"
    local = notebook.launcher_env("local", spec, inherited)
    assert not any(k.startswith("SLURM_") for k in local) and local["HF_TOKEN"] == "s3cret"


def test_srun_and_sbatch_ask_for_the_same_node_resources(tiny_job, tmp_path):
    """One renderer (launch.NodeResources, issue 35): a notebook's srun line and a submitted job's
    sbatch parameters ask for the same memory, GPUs and CPUs. 0.3 GB is 307.2 MiB: the srun line
    used to truncate it to 307M where sbatch asked for 308M."""
    from clusterfsdp import notebook
    from clusterfsdp.control import launch

    spec = notebook.with_layout(
        notebook.load_job(tiny_job, {"slurm.cpus_per_task": 2, "slurm.mem_gb": 0.3}), nodes=1, gpus_per_node=1
    )
    srun = notebook.srun_command(spec, tmp_path / "run", step_name="s")
    sbatch = launch.sbatch_options(spec)
    asked = {"gpus-per-node": "1", "cpus-per-task": "2", "mem": "308M"}
    assert {k: str(sbatch[k.replace("-", "_")]) for k in asked} == asked
    assert [f"--{k}={v}" for k, v in asked.items()] == [a for a in srun if a.split("=")[0][2:] in asked]


def test_submit_function_accepts_toml_text_and_refuses_unreachable_slurm(tmp_path, monkeypatch):
    import clusterfsdp
    from clusterfsdp.control import launch
    from clusterfsdp.core import slurmcli

    monkeypatch.setattr(slurmcli, "controller", lambda: "none")
    with pytest.raises(launch.SubmitError, match="no Slurm controller answers"):
        clusterfsdp.submit(f'[job]\nrun_root = "{tmp_path}"\n', executor="slurm")
    assert not any(tmp_path.iterdir())


def test_importing_the_package_and_notebook_module_stays_cheap():
    code = (
        "import sys, clusterfsdp, clusterfsdp.notebook; "
        "print(sorted(m for m in ('torch', 'IPython', 'submitit', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# ---------------------------------------------------------------- real notebooks, no Slurm
def test_local_fallback_notebook_streams_progress_and_returns_the_result(tiny_job, tmp_path):
    """No allocation and no Slurm: srun() runs local processes, streams rank-prefixed output into
    the cell, shows a progress display, and returns the result (the magics, the same way: in
    test_demo_notebook_runs_without_slurm, whose notebook runs them). Here SLURM_CONF names a
    missing file, which the launcher takes as no Slurm without asking scontrol (the other
    notebooks get an empty slurm.conf, which scontrol refuses at once)."""
    job = str(tiny_job)
    secret = "s3cr3t-never-in-a-file"
    nb = make_notebook(
        [
            "from clusterfsdp.notebook import srun\nimport clusterfsdp, os",
            f"r = srun({job!r}, overrides={{'train.steps': 30, 'env.WANDB_API_KEY': {secret!r}}}, all_ranks=True)",
            RESULT_CELL,
        ]
    )
    nb, report = run_notebook(nb, tmp_path, no_slurm_env(tmp_path, missing_conf=True))
    out = stream_text(nb.cells[1])
    assert "launcher: local processes on this machine (no Slurm allocation and no reachable Slurm controller)" in out
    host = os.uname().nodename
    for rank in (0, 1):
        for step in (10, 20, 30):
            assert re.search(rf"^\[rank{rank} {re.escape(host)}\] step {step}/30 loss \d", out, re.M), out
    progress = [d for d in displays(nb.cells[1]) if "<progress" in d["data"].get("text/html", "")]
    assert progress, nb.cells[1].outputs
    final = progress[-1]["data"]  # nbclient applied the in-place updates
    assert "value='30' max='30'" in final["text/html"] and "completed" in final["text/html"]
    assert "step 30/30" in final["text/plain"] and "loss" in final["text/plain"]

    r = json_line(nb.cells[2])
    assert r["status"] == "completed" and r["launcher"] == "local" and r["exit_codes"] == {"0": 0, "1": 0}
    assert r["steps"] == [10, 20, 30] and r["final"]["step"] == 30 and r["final"]["tokens_per_s"] > 0
    assert r["checkpoint"].endswith("step-00000030") and Path(r["checkpoint"]).is_dir()
    run_dir = Path(r["run_dir"])
    state = json.loads((run_dir / "state.json").read_text())
    assert state["executor"] == "local" and state["attempts"][0]["job_id"] == r["job_id"]
    assert (run_dir / "logs" / f"{r['job_id']}.0" / "rank1.log").is_file()
    node = json.loads(next((run_dir / "nodes").rglob("*.json")).read_text())
    assert node["warm_start"] is True  # the local supervisor imported torch once and forked the ranks
    for f in run_dir.rglob("*"):  # the secret reached the ranks through the environment only
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    assert secret not in json.dumps([c.outputs for c in nb.cells])  # nor in the cell output
    st = subprocess.run(
        [sys.executable, "-m", "clusterfsdp.cli", "status", str(run_dir)], capture_output=True, text=True, timeout=60
    )
    assert "state      COMPLETED" in st.stdout, st.stdout + st.stderr
    print(f"local fallback notebook: {report['total_s']:.1f} s")


def test_stop_button_cancels_local_ranks_and_kernel_stays_usable(tiny_job, tmp_path):
    job = str(tiny_job)
    nb = make_notebook(
        [
            "from clusterfsdp.notebook import srun",
            (f"srun({job!r}, overrides={{'train.steps': 100000}})", ["raises-exception"]),
            RESULT_CELL,
            "print('ANSWER', 6 * 7)",
        ]
    )
    nb, report = run_notebook(nb, tmp_path, no_slurm_env(tmp_path), interrupt=(1, r"step 20/100000"))
    cell = nb.cells[1]
    (err,) = errors(cell)
    assert err["ename"] == "StepInterrupted", err
    assert len(err["traceback"]) == 2 and "cancelled with SIG" in err["traceback"][0]  # a message, no traceback
    out = stream_text(cell)
    m = re.search(
        r"local job (nb\d+) cancelled with (SIGTERM|SIGKILL), all 2 ranks gone (\d+\.\d) s after the "
        r"interrupt(?:; saved step (\d+))?",
        out,
    )
    assert m, out
    how, gone_s, saved = m.group(2), m.group(3), m.group(4)
    assert report["procs_after"] == [], report["procs_after"]  # every rank was gone when the cell returned
    r = json_line(nb.cells[2])
    assert r["status"] == "interrupted" and r["job_id"] == m.group(1) and r["step"] == ""
    # within the grace period (20 s by default, as for `clusterfsdp cancel`) the ranks stopped at a
    # step boundary and saved a checkpoint together (docs/notebooks.md "Stopping")
    assert how == "SIGTERM" and saved and r["exit_codes"] == {"0": 0, "1": 0}, (out, r)
    assert r["checkpoint"].endswith(f"step-{int(saved):08d}") and Path(r["checkpoint"]).is_dir(), r
    assert "ANSWER 42" in stream_text(nb.cells[3])
    st = subprocess.run(
        [sys.executable, "-m", "clusterfsdp.cli", "status", r["run_dir"]], capture_output=True, text=True, timeout=60
    )
    assert "state      CANCELLED" in st.stdout, st.stdout
    print(
        f"local interrupt: {how}, all ranks gone {gone_s} s after the interrupt (measured in the kernel), "
        f"cell returned {report['interrupt_to_cell_done_s']:.1f} s after the interrupt"
    )


def test_outside_allocation_error_in_notebook(tiny_job, tmp_path):
    """A controller answers but the kernel is not in an allocation: a clear error, no traceback,
    nothing created; with no Slurm at all launcher='srun' says the same."""
    job = str(tiny_job)
    nb = make_notebook(
        [
            "from clusterfsdp.notebook import srun\n%load_ext clusterfsdp",
            (f"srun({job!r})", ["raises-exception"]),
            (f"%clusterfsdp srun {job} --nodes 1", ["raises-exception"]),
            "import os\nprint('RUNS', os.path.exists(" + repr(str(tmp_path / "runs")) + "))",
        ]
    )
    nb, _ = run_notebook(nb, tmp_path, fake_controller_env(tmp_path))
    for i in (1, 2):
        (err,) = errors(nb.cells[i])
        text = "\n".join(err["traceback"])
        assert err["ename"] == "NotInAllocation", err
        assert "salloc" in text and "clusterfsdp.submit(" in text and "%clusterfsdp submit" in text
        assert "Traceback" not in text and "File " not in text
    assert "RUNS False" in stream_text(nb.cells[3])

    nb = make_notebook(
        [(f"from clusterfsdp.notebook import srun\nsrun({job!r}, launcher='srun')", ["raises-exception"])]
    )
    nb, _ = run_notebook(nb, tmp_path, no_slurm_env(tmp_path))
    (err,) = errors(nb.cells[0])
    assert err["ename"] == "NotInAllocation" and "SLURM_JOB_ID is not set" in err["evalue"]


def test_demo_notebook_runs_without_slurm(tiny_job, tmp_path):
    """jobs/notebook-demo.ipynb as shipped, top to bottom, on a machine without Slurm (its long run
    stopped with the stop button)."""
    import nbformat

    from clusterfsdp.control import status
    from clusterfsdp.core import runfolder

    shutil.copy(tiny_job, tmp_path / "tiny-cpu.toml")  # the demo's job, with runs under tmp_path
    nb = nbformat.read(REPO / "jobs" / "notebook-demo.ipynb", as_version=4)
    long_run = next(i for i, c in enumerate(nb.cells) if "100000" in c.source)
    nb.cells[long_run].metadata["tags"] = ["raises-exception"]
    nb, report = run_notebook(nb, tmp_path, no_slurm_env(tmp_path), interrupt=(long_run, r"step 10/100000"))
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not errors(c) for c in code if c is not nb.cells[long_run]), [errors(c) for c in code]
    assert errors(nb.cells[long_run])[0]["ename"] == "StepInterrupted"
    text = json.dumps([c.outputs for c in code])
    assert "status</th><td style='text-align:left'>completed" in text and "interrupted" in text
    assert re.search(r"\[rank1 \S+\] step 60/60", text)
    magic = next(c for c in code if "%clusterfsdp srun" in c.source)  # the magics, as srun() and submit
    assert re.search(r"^\[rank0 \S+\] step 20/20", stream_text(magic), re.M) and "[rank1 " not in stream_text(magic)
    assert "'completed'" in json.dumps([d["data"].get("text/plain", "") for d in displays(magic)])
    submitted = stream_text(next(c for c in code if "%clusterfsdp submit" in c.source))
    assert "run " in submitted and "clusterfsdp logs" in submitted and "local" in submitted, submitted
    for run in runfolder.list_runs(tmp_path / "runs"):  # the demo's batch job finishes; nothing left running
        deadline = time.time() + 240
        while status.run_status(run).state not in ("COMPLETED", "CANCELLED", "FAILED") and time.time() < deadline:
            time.sleep(1)
        assert status.run_status(run).state in ("COMPLETED", "CANCELLED"), run.path
    print(f"demo notebook: {report['total_s']:.1f} s")


def test_failed_rank_gives_exit_status_per_rank(tiny_job, tmp_path):
    """A rank that fails stops the others (like srun --kill-on-bad-exit); the result has every rank's
    exit status and its error, and check=True raises instead of returning. The failure is one the
    control plane cannot see before launching (it reads only the first record of each source, as
    for `submit`): a .jsonl whose second line is not JSON, found by rank 0's data preparation."""
    import io

    from clusterfsdp import notebook

    out = io.StringIO()
    data = tmp_path / "broken.jsonl"
    first = json.dumps({"text": "a first record that reads, long enough for a global batch. " * 60})
    data.write_text(f"{first}\nnot json\n")  # (the pre-queue size check sees enough tokens)
    bad = {"data.paths": [str(data)]}
    r = notebook.srun(tiny_job, overrides=bad, launcher="local", progress=False, out=out)
    text = out.getvalue()
    assert r.status == "failed" and not r.ok and set(r.exit_codes) == {0, 1}, text
    # the first rank to fail exits 1; the other one fails too or is stopped (SIGTERM: -15)
    assert 1 in r.exit_codes.values() and all(c not in (0, None) for c in r.exit_codes.values()), r.exit_codes
    assert r.returncode != 0 and "DataError" in text and "broken.jsonl:2" in r.message, (text, r.message)
    assert re.search(r"^\[rank\d \S+\] \S*DataError: ", text, re.M)  # rank 0 live, others' tails at the end
    with pytest.raises(notebook.StepFailed) as e:
        notebook.srun(tiny_job, overrides=bad, launcher="local", progress=False, out=io.StringIO(), check=True)
    assert 1 in e.value.result.exit_codes.values()


@pytest.mark.parametrize("served", [True, False], ids=["served", "child"])
def test_ranks_stop_when_the_kernel_dies(tiny_job, tmp_path, served):
    """A kernel killed mid-run (restart, crash) must not leave its ranks running. The local
    supervisor forked by a warm launcher (`CLUSTERFSDP_LAUNCHER`, this suite's; control/backends._served)
    is not the kernel's child: its stdin reaches end-of-file; started by the kernel itself, it has a
    parent-death signal. Either way the ranks get SIGTERM, save and exit."""
    from clusterfsdp.core import warmlaunch

    script = tmp_path / "kernel.py"
    script.write_text(
        "from clusterfsdp import notebook\n"
        f"notebook.srun({str(tiny_job)!r}, overrides={{'train.steps': 100000}}, launcher='local')\n"
    )
    log = tmp_path / "kernel.out"
    launcher = os.environ[warmlaunch.ENV_LAUNCHER]
    env = {k: v for k, v in os.environ.items() if served or k != warmlaunch.ENV_LAUNCHER}
    with open(log, "w") as f:
        kernel = subprocess.Popen(
            [sys.executable, str(script)], stdout=f, stderr=subprocess.STDOUT, cwd=tmp_path, env=env
        )  # fmt: skip
    try:
        deadline = time.time() + 180
        while "step 10/100000" not in log.read_text() and time.time() < deadline and kernel.poll() is None:
            time.sleep(0.2)
        assert "step 10/100000" in log.read_text(), log.read_text()
        found = re.search(r"run folder (\S+)", log.read_text())
        assert found, log.read_text()
        run_dir = found.group(1)
        (supervisor,) = [int(p.split()[0]) for p in _processes_matching(f"_local {run_dir}")]
        parent = Path(f"/proc/{supervisor}/stat").read_text().rsplit(")", 1)[1].split()[1]
        assert (int(parent) == kernel.pid) is not served  # forked by the launcher, or the kernel's child
        assert (launcher.encode() in Path(f"/proc/{parent}/cmdline").read_bytes()) is served
        kernel.kill()
        t0 = time.time()
        while _processes_matching(run_dir) and time.time() - t0 < 20:
            time.sleep(0.2)
        assert _processes_matching(run_dir) == []
        gone_s = time.time() - t0
    finally:
        kernel.kill()
    events = [json.loads(line) for line in (Path(run_dir) / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "stopped", events  # SIGTERM: a clean, saved stop
    print(f"kernel killed: all ranks gone {gone_s:.1f} s later")


def test_a_kernel_holds_a_served_supervisors_pipe_end_only_while_it_runs(tiny_job, tmp_path):
    """Each served local supervisor's stdin is a pipe whose write end the kernel keeps open while
    it runs (control/backends._served); once it ended, the next launch closes it: a notebook that
    launches many times does not collect file descriptors."""
    script = tmp_path / "kernel.py"
    script.write_text(
        "import os\n"
        "from clusterfsdp import notebook\n"
        "from clusterfsdp.control import backends\n"
        "ends = []\n"
        "for _ in range(3):\n"
        f"    notebook.srun({str(tiny_job)!r}, overrides={{'train.steps': 2}}, launcher='local')\n"
        "    ends.append([fd for _, fd in backends._OWNERS])\n"
        "open_now = [fd for fds in ends for fd in fds if os.path.exists(f'/proc/self/fd/{fd}')]\n"
        "print('OWNERS', [len(e) for e in ends], len(set(open_now)))\n"
    )
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    said = [line for line in r.stdout.splitlines() if line.startswith("OWNERS")]
    assert said == ["OWNERS [1, 1, 1] 1"], said  # served each time; only the last one's end still open


# ---------------------------------------------------------------- runner entry point (used under salloc)
def _main(argv: list[str]) -> int:
    import argparse

    import nbformat

    p = argparse.ArgumentParser()
    p.add_argument("notebook_in")
    p.add_argument("notebook_out")
    p.add_argument("report")
    p.add_argument("--interrupt", nargs=2, metavar=("CELL", "REGEX"))
    p.add_argument("--cwd", default=".")
    args = p.parse_args(argv)
    nb = nbformat.read(args.notebook_in, as_version=4)
    interrupt = (int(args.interrupt[0]), args.interrupt[1]) if args.interrupt else None
    report: dict = {}
    try:
        nb, report = run_notebook(nb, Path(args.cwd), dict(os.environ), interrupt=interrupt)
    except Exception as e:
        report["error"] = f"{type(e).__name__}: {e}"
    report["slurm_job_id"] = os.environ.get("SLURM_JOB_ID")
    nbformat.write(nb, args.notebook_out)
    Path(args.report).write_text(json.dumps(report, indent=2, default=str))
    return 0 if "error" not in report else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
