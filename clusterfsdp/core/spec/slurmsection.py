"""The sections that say where and as what a job runs: `[job]` (name, run root, seed, the loader
variables `[env]` may set), `[slurm]` and `[slurm.container]`."""

# No `from __future__ import annotations` here: the codec resolves these annotations on every
# load (`schema.hints`), and strings would be compiled one by one each time (start-up, issue 25 item 3).

from typing import Literal

from ..value import value
from .docfield import F

# Upper bounds of counts that start processes or threads on one host: more is a typo, and would
# exhaust the node (or the login node, for prepare) before anything useful happens.
MAX_TASKS_PER_NODE = 256  # slurm.tasks_per_node, slurm.gpus_per_node

# [env] variables that decide which code the workers (and their subprocesses) load, or which
# startup files a shell reads. Another user's job file, or a planted run folder resumed by its
# victim, could run anything through them; a job that means it names them in job.allow_env.
LOADER_ENV = (
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "PATH",
    "BASH_ENV",
    "ENV",
    "PYTHONWARNINGS",  # a warning category is imported by name: PYTHONWARNINGS=error::mod.Cls imports mod
    "PYTHONPYCACHEPREFIX",  # where the interpreter takes compiled .pyc files from
    "TORCHINDUCTOR_CACHE_DIR",  # compiled kernels (shared libraries, Python) loaded from there
    "TRITON_CACHE_DIR",
    "TORCH_EXTENSIONS_DIR",  # C++/CUDA extensions built and loaded from there
    "NCCL_NET_PLUGIN",  # shared libraries NCCL dlopens
    "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN",
    "GCONV_PATH",  # glibc's iconv modules, dlopened
)


@value
class JobSection:
    """[job]: the run's name, where its folder goes, its seed."""

    name: str = F("job", "Job name; runs go to <run_root>/<name>/<run id>/ and it names the Slurm job.")
    run_root: str = F(
        "",
        "Folder that holds run folders (relative to this file); on a cluster it must be on the shared filesystem. "
        "Empty: $CLUSTERFSDP_RUN_ROOT, else run_root in ~/.config/clusterfsdp/config.toml, else ./runs beside "
        "this file (the same default `runs`, `status` and the TUI use).",
    )
    seed: int = F(0, "Seed for model init, data order and dropout; same seed + same world size = same losses.")
    allow_env: list[str] = F(
        [],
        f"[env] variables that change which code the workers load, set on purpose: any of {', '.join(LOADER_ENV)}. "
        "They are refused in [env] unless named here, so a job file (or a run folder) from someone else cannot "
        "slip them in unnoticed.",
    )


@value
class ContainerSection:
    """[slurm.container]: the image the workers run in (pyxis, Apptainer, OCI)."""

    kind: Literal["none", "pyxis", "apptainer", "oci"] = F(
        "none",
        "Run the workers in a container: 'pyxis' (srun --container-image, NVIDIA clusters with pyxis/enroot), "
        "'apptainer' (apptainer exec), 'oci' (Slurm's own srun --container=BUNDLE through oci.conf); 'none': "
        "the Python that submits.",
    )
    image: str = F(
        "",
        "pyxis: an image ('nvcr.io#nvidia/pytorch:24.05-py3') or a .sqsh file; apptainer: a .sif file (or "
        "'docker://...'); oci: the bundle folder (config.json + rootfs/), an absolute path that every node sees.",
    )
    python: str = F(
        "python3",
        "The Python inside the image that runs the workers; it needs clusterfsdp (same version) and torch installed.",
    )
    mounts: list[str] = F(
        [],
        "Host folders to mount, 'SRC:DST' or 'SRC:DST:ro' (pyxis --container-mounts, apptainer --bind). The run "
        "root and checkpoint.dir are always mounted at their own paths. oci: the bundle's config.json mounts.",
    )
    workdir: str = F("", "Working directory inside the container (empty: the image's default). pyxis and apptainer.")
    options: list[str] = F(
        [],
        "Further launcher options, e.g. ['--no-container-mount-home'] (pyxis) or ['--cleanenv'] (apptainer).",
    )


@value
class SlurmSection:
    """[slurm]: what each attempt asks of Slurm, and how it comes back after an interruption."""

    partition: str = F("", "Slurm partition (empty: the cluster's default).")
    account: str = F("", "Slurm account to charge (empty: your default).")
    qos: str = F("", "Slurm QOS (empty: default).")
    nodes: int | str = F(
        1,
        "Number of nodes, or a range 'MIN-MAX' (an elastic start: the job starts on as many as are free, keeps the "
        "global batch through train.grad_accum, which is the accumulation at MAX, and grows when more are free, "
        "up to slurm.max_grows times; docs/recovery.md, 'Elastic starts').",
    )
    gpus_per_node: int = F(
        0, f"GPUs per node; one worker process per GPU. 0 for CPU-only jobs (at most {MAX_TASKS_PER_NODE})."
    )
    tasks_per_node: int = F(
        0, f"Worker processes per node; 0 means one per GPU (or 1 without GPUs); at most {MAX_TASKS_PER_NODE}."
    )
    cpus_per_task: int = F(0, "CPUs per worker process (0: Slurm's default).")
    mem_gb: float = F(0.0, "Memory per node in GB (0: Slurm's default).")
    time: int | str = F(
        60, "Time limit: minutes (int) or Slurm's forms 'MM', 'HH:MM:SS', 'D-HH', 'D-HH:MM', 'D-HH:MM:SS'."
    )
    time_min: int | str = F(
        0,
        "Least time limit the job accepts (--time-min): Slurm's backfill may start it sooner with a time limit "
        "between this and slurm.time; the workers save and requeue before whichever limit it got. Forms as for "
        "slurm.time; 0: none.",
    )
    max_grows: int = F(
        2,
        "With a node range: how many times a run may checkpoint and requeue itself to grow onto nodes that came "
        "free (rank 0 asks sinfo every slurm.grow_check_s); 0: start on what is free, never grow.",
    )
    grow_check_s: int = F(
        60, "With a node range below its largest size: seconds between rank 0's checks for free nodes (sinfo)."
    )
    constraint: str = F("", "Slurm --constraint (node features), e.g. 'h100'.")
    exclusive: bool = F(False, "Ask for whole nodes (--exclusive).")
    requeue: bool = F(True, "Let Slurm requeue the job after preemption or node failure (--requeue).")
    signal_grace_s: int = F(120, "Seconds before the time limit at which workers get SIGUSR2 to save and requeue.")
    max_restarts: int = F(
        3,
        "Automatic restarts a run may use: after failures (a killed rank, a failed node, a collective "
        "timeout), and after interruptions (time limit, preemption) that saved no progress.",
    )
    preflight: bool = F(
        True,
        "Before step 1 of every attempt each node checks its GPUs, the free space where checkpoints go and in "
        "/dev/shm, its network path to the master, and a short all-reduce (nodes/<job>.<restart>/<host>.json); "
        "a node that fails is left out of the next attempt, which uses a restart (docs/recovery.md).",
    )
    max_gpu_hours: float = F(
        0.0,
        "Budget of the run in GPU-hours, as Slurm accounts them (AllocTRES gres/gpu x elapsed, every attempt and "
        "requeue): an attempt whose own plan (nodes x gpus_per_node x time) would pass what is left is refused "
        "before queueing, and the workers save a checkpoint and stop once it is used. 0: no budget.",
    )
    quarantine_hours: float = F(
        24.0,
        "Hours a node stays excluded from later submits (of every user sharing the run root's node record) after "
        "a run found it faulty: failed pre-flight, named by a hang, lost mid-run. 0: never exclude recorded nodes. "
        "`clusterfsdp nodes` lists them, `nodes clear NODE` ends a quarantine.",
    )
    preflight_free_gb: float = F(
        1.0, "Pre-flight: least free GiB where checkpoints go (the newest checkpoint's size when that is larger)."
    )
    preflight_shm_gb: float = F(
        0.05,
        "Pre-flight: least free GiB in /dev/shm (with checkpoint.async_mode = 'process', this node's share of the "
        "newest checkpoint when that is larger: the saver's staging buffers live there).",
    )
    extra: dict[str, str | int | bool] = F(
        {},
        "Extra sbatch options, e.g. { reservation = 'big', 'gres-flags' = 'enforce-binding' }. Options "
        "clusterfsdp manages (time, nodes, ntasks*, signal, export, array, requeue, output, error, job-name, "
        "hold, dependency, ...) and their abbreviations are refused: set the [slurm] key instead; many "
        "points of a sweep are not one job array. `comment` and `exclude` are merged with clusterfsdp's own.",
    )
    setup: list[str] = F(
        [],
        "Shell lines run once on the batch host before the workers start (module load, venv activation). "
        "Each entry is one line; #SBATCH lines, here-documents (<<), trailing backslashes and lines bash "
        "cannot parse together (unbalanced quotes, an if without fi) are refused.",
    )
    container: ContainerSection = F(
        ContainerSection(), "The container the workers run in ([slurm.container]; Slurm jobs only)."
    )
