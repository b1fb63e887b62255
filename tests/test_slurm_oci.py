"""Slurm's own OCI containers, for real: `[slurm.container] kind = "oci"` on the devcluster, whose
oci.conf runs Debian's runc in Run mode (slurm/oci.conf.in). A 2-node job trains inside an OCI
bundle that the test builds. Inside it the ranks have no SLURM_PROCID of their own (Slurm 22.05
writes the container's environment per step, not per task): they take it from the node's place in
the step's node list (worker/distenv.py), and so does submitit's task numbering (worker/ocitask.py).

The bundle is the cheapest real one: an almost empty rootfs/ whose config.json bind-mounts the
host's /usr and the venv's base Python (its libraries), /etc (users, the node's hosts file), this checkout
with its venv, and the test's folder, each at its own path, so no image is built or copied. It
holds one file of its own, the training corpus at /corpus-in-bundle.txt, a path the host does
not have: a job that ran on the host instead (which Slurm does silently when oci.conf is
missing) fails to find its data. Namespaces: pid, mount and ipc; network and UTS are the node's
(a private network namespace is loopback-only and breaks torch.distributed across nodes, and a
private hostname breaks gloo's interface choice)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from procs import CORPUS, tiny_job_toml

from clusterfsdp.control.run import Run
from clusterfsdp.core import runfolder

REPO = Path(__file__).resolve().parents[1]
IN_BUNDLE = "/corpus-in-bundle.txt"


def build_bundle(folder: Path, shared: Path) -> Path:
    """An OCI bundle (config.json + rootfs/) in `folder`; `shared` is mounted read-write."""
    bundle, rootfs = folder / "bundle", folder / "bundle" / "rootfs"
    for sub in ("usr", "etc", "proc", "dev", "sys", "tmp", "run", "root"):
        (rootfs / sub).mkdir(parents=True)
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):  # usr-merged: links into /usr
        host = Path("/") / name
        if host.is_symlink():
            os.symlink(os.readlink(host), rootfs / name)
    (rootfs / IN_BUNDLE.lstrip("/")).write_bytes(CORPUS.read_bytes())
    subprocess.run(["runc", "spec"], cwd=bundle, check=True)
    config = json.loads((bundle / "config.json").read_text())
    linux = config["linux"]
    linux["namespaces"] = [ns for ns in linux["namespaces"] if ns["type"] not in ("network", "uts", "cgroup")]
    config.pop("hostname", None)
    config["root"] = {"path": "rootfs", "readonly": False}
    config["process"]["cwd"] = "/"
    config["process"]["terminal"] = False
    config["process"]["env"] = []  # Slurm appends the job's environment; no duplicate PATH before it
    binds = [("/usr", "ro"), (sys.base_prefix, "ro"), ("/etc", "ro"), (str(REPO), "ro"), (str(shared), "rw"),
             ("/dev/shm", "rw")]  # fmt: skip
    for path in dict.fromkeys(str(Path(p).resolve()) for p, _ in binds):
        mode = dict(binds).get(path, "rw")
        for part in Path(path).relative_to("/").parents:  # mount points inside rootfs
            (rootfs / part).mkdir(parents=True, exist_ok=True)
        (rootfs / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
        config["mounts"].append({"destination": path, "type": "bind", "source": path, "options": ["rbind", mode]})
    (bundle / "config.json").write_text(json.dumps(config, indent=2))
    return bundle


def test_the_bundle_runs_this_checkouts_python_under_runc(tmp_path):
    """The bundle itself, without Slurm: runc (the devcluster's runtime, slurm/oci.conf.in) runs
    the venv's Python in it, which imports the worker and reads the corpus that exists only inside
    the bundle."""
    bundle = build_bundle(tmp_path, tmp_path)
    config = json.loads((bundle / "config.json").read_text())
    code = f"import clusterfsdp.worker, os; print(len(open({IN_BUNDLE!r}, 'rb').read()), os.getpid())"
    config["process"]["args"] = [sys.executable, "-c", code]
    config["process"]["env"] = [f"PATH={os.environ['PATH']}"]
    (bundle / "config.json").write_text(json.dumps(config))
    r = subprocess.run(
        ["runc", "--rootless=true", f"--root={tmp_path / 'runc'}", "run", "--bundle", str(bundle), "t1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    size, pid = r.stdout.split()
    assert int(size) == CORPUS.stat().st_size and pid == "1"  # its own pid namespace
    assert not Path(IN_BUNDLE).exists()


@pytest.mark.slurm
def test_two_node_job_trains_inside_an_oci_bundle(slurm_cluster, tmp_path):
    bundle = build_bundle(tmp_path, tmp_path)
    job = tmp_path / "job.toml"
    container = f'[slurm.container]\nkind = "oci"\nimage = "{bundle}"\npython = "{sys.executable}"\n'
    tail = f"[slurm]\nnodes = 2\ntasks_per_node = 1\n{container}"
    job.write_text(
        tiny_job_toml("oci", seed=1, steps=6, fsdp='sharding = "full"', tail=tail).replace(str(CORPUS), IN_BUNDLE)
    )
    r = subprocess.run(
        [sys.executable, "-m", "clusterfsdp", "submit", str(job), "--set", f"job.run_root={tmp_path / 'runs'}",
         "--executor", "slurm", "--follow"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "2 ranks on 2 node(s)" in r.stdout and "step 6/6" in r.stdout
    (run,) = runfolder.list_runs(tmp_path / "runs")
    hosts = {json.loads(p.read_text())["hostname"] for p in run.nodes_dir.rglob("*.json")}
    assert hosts == {"node1", "node2"}
    assert not Path(IN_BUNDLE).exists()  # the data was only inside the bundle
    (attempt,) = run.attempts
    job_dir = run.submitit_dir / attempt.job_id  # submitit's: its batch script and the pickled call
    script = (job_dir / f"{attempt.job_id}_submission.sh").read_text()
    ocitask = "-u -m clusterfsdp.worker.ocitask -u -m submitit.core._submit"
    assert f"--container={bundle} {sys.executable} {ocitask} {run.submitit_dir}/%j" in script
    assert (job_dir / f"{attempt.job_id}_submitted.pkl").is_file()
    assert Run(run).wait(poll_s=1) == "completed"  # rank 0's result, through submitit's job object
    # submitit numbered each node's task as the worker did (worker/ocitask.py): each saved its own
    # result file, where both used to be task 0 and race for one (clean-clone run 25)
    logs = {k: (job_dir / f"{attempt.job_id}_{k}_log.out").read_text() for k in (0, 1)}
    assert "global_rank=0(2)" in logs[0] and "global_rank=1(2)" in logs[1], logs
    assert {p.name for p in job_dir.glob("*_result.pkl")} == {f"{attempt.job_id}_{k}_result.pkl" for k in (0, 1)}
