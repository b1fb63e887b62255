"""What runs on every rank: `python -m clusterfsdp.worker RUN_DIR` (or the control plane's
`WorkerCall`, which submitit pickles). Reads the run folder's job.toml, sets up
torch.distributed, builds and shards the model, trains, checkpoints and records events.

Importing this package (or `worker.main`, `attempt`, `warmstart`, `distenv`) does not import
torch; the modules that need it import it at their top and are only imported once a rank starts
(`main.run` imports `rank`, the torch half, after it has installed the stop flags).
"""
