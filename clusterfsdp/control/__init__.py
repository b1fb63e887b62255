"""The control plane: everything that decides, records and watches runs, and never touches a GPU.

It runs on the login node or a laptop (the CLI, the TUI, a notebook kernel: submit, resume,
status, logs, export's launcher), and also inside jobs, on CPU, around and beside the ranks: the
batch script's job steps before and after srun (`jobstep`), and rank 0's comeback after a save
(`Run.come_back`: requeue, or a follow-up job) go through the same run service.

The job spec, the run folder contract, the run service and its backends (Slurm batch
jobs, local processes, an srun step in an allocation), Slurm's client
commands, status, logs, the checkpoint folder layout and the local test cluster. Pure Python:
nothing in this package imports torch, transformers or `clusterfsdp.worker` (tests/test_layout.py
checks it), so `clusterfsdp --help`, `validate`, `status` and the TUI start in well under a second.
"""
