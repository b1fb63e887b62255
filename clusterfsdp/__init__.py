"""clusterfsdp: from a job.toml to a multi-node FSDP2/HSDP training run on Slurm (or this machine).

Importing the package is cheap (no torch); the worker imports torch lazily.
"""

__version__ = "0.1.0"
