"""Slurm's own OCI containers, for real: `[slurm.container] kind = "oci"` on the devcluster, whose
oci.conf runs Debian's runc in Run mode (slurm/oci.conf.in). The bundle that the test builds runs
this checkout's Python under runc. (The 2-node job inside the bundle on the devcluster, branch
`oci-e2e-wip`, hung at srun with empty logs on its first run and is not in the suite until it
passes; issue 18's note has the details.)

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

from procs import CORPUS

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
