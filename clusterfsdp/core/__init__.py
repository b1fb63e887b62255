"""The ground floor: the contracts every other package shares (the job spec, the records and
the run and checkpoint folders, file primitives, the lock, outcomes, Slurm's client commands, the
value decorator). It imports nothing of clusterfsdp above it, and nothing heavy."""
