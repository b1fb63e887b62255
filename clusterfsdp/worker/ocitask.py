"""`PYTHON -u -m clusterfsdp.worker.ocitask -u -m submitit.core._submit FOLDER`: how each srun task
starts inside a Slurm OCI container (`[slurm.container] kind = "oci"`, `control.launch.task_launch`).

Slurm 22.05 writes an OCI container's environment once per step, before its tasks exist: under
sbatch every task in it sees the batch step's SLURM_PROCID=0, SLURM_NODEID=0 and SLURM_LOCALID=0.
`distenv` ranks the worker by the node's place in the step's node list, but submitit numbers its
task from SLURM_PROCID before it calls the worker, so the task on every node was submitit's task
0, and each saved `<job>_0_result.pkl` through the same temporary file: when two finished in the
same millisecond, one rename found the file gone and that task failed after training had
completed (clean-clone CI run 25, `FileNotFoundError: No file was saved at the temporary path`).

This sets the three variables to the task's own (one task per node: the rank is the node's index,
the local rank 0; `distenv.oci_node`), then runs the module that follows as `python -m` does.
Anywhere else, and for a container whose hostname is not a node's (the worker then stops with
distenv's message, recorded in the run), it changes nothing. Torch-free and tiny: it runs before
submitit's own start-up.
"""

from __future__ import annotations

import os
import runpy
import sys

from . import distenv

USAGE = "usage: python -m clusterfsdp.worker.ocitask [-u] -m MODULE [ARGS...]"


def task_variables(env: dict[str, str]) -> dict[str, str]:
    """The Slurm task variables this task should have inside an OCI container ({} elsewhere)."""
    try:
        node = distenv.oci_node(env)
    except RuntimeError:  # a hostname that is not a node's: the worker says so, in the run's events
        return {}
    if node is None:
        return {}
    return {"SLURM_PROCID": str(node), "SLURM_NODEID": str(node), "SLURM_LOCALID": "0"}


def main(argv: list[str]) -> None:
    # submitit writes `PYTHON -u -m submitit.core._submit`: this interpreter is unbuffered already
    args = argv[1:] if argv[:1] == ["-u"] else argv
    if len(args) < 2 or args[0] != "-m":
        sys.exit(USAGE)
    os.environ.update(task_variables(dict(os.environ)))
    sys.argv = [sys.argv[0], *args[2:]]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
