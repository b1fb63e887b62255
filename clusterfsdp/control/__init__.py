"""The control plane: everything that runs on the login node (or a laptop) and never on a GPU.

The job spec, the run folder contract, submission through submitit, Slurm's client commands,
status, logs, the checkpoint folder layout and the local test cluster. Pure Python: nothing in
this package imports torch, transformers or `clusterfsdp.worker` (tests/test_layout.py checks
it), so `clusterfsdp --help`, `validate`, `status` and the TUI start in well under a second.
"""
