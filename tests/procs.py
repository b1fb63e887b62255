"""Launch real worker processes on this machine with torchrun-style environment variables."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import pty
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import rankserver

from clusterfsdp.core import ckptfolder, runfolder
from clusterfsdp.core import spec as S
from clusterfsdp.core.presets import PRESETS
from clusterfsdp.core.records import Executor
from clusterfsdp.worker import distenv

CORPUS = Path(__file__).resolve().parents[1] / "jobs" / "data" / "corpus.txt"


def tiny_job_toml(name: str, seed: int, steps: int, fsdp: str = "", tail: str = "") -> str:
    """The job.toml text the multi-process tests share: llama-tiny on the shipped corpus in fp32
    (so runs compare bitwise), loss logged every step. `fsdp` adds lines to [fsdp]; `tail` adds
    tables. (conftest's `tiny_job` fixture is the other starting point: jobs/tiny-cpu.toml.)"""
    return f"""
[job]
name = "{name}"
seed = {seed}
[model]
preset = "llama-tiny"
[data]
source = "files"
paths = ["{CORPUS}"]
seq_len = 64
[train]
steps = {steps}
micro_batch_size = 2
lr = 3e-3
warmup = 2
log_every = 1
[fsdp]
mixed_precision = "fp32"
{fsdp}
{tail}"""


def free_port() -> int:
    """A free port outside the kernel's ephemeral range (distenv.free_master_port; one from bind(port 0)
    may be taken by an outgoing connection before the ranks' master binds it)."""
    return distenv.free_master_port()


def make_run(job_text: str, run_root: Path, overrides: Sequence[str] = ()) -> runfolder.RunFolder:
    spec = S.loads(job_text, [f"job.run_root={str(run_root)!r}", *overrides])
    return runfolder.create_run(spec, Executor.LOCAL)


def allocation_variable(key: str) -> bool:
    """Whether `key` is one a test must not inherit from an allocation the suite runs in (conftest
    removes them before every test: tests decide themselves whether they run inside one)."""
    return key.startswith(("SLURM_", "SRUN_", "SUBMITIT_")) or key in ("RANK", "WORLD_SIZE", "MASTER_PORT")


# What every rank of `launch` has, whatever the test: one torch thread, and inductor compiling in the
# rank's own process (`inductor_env`; torch._inductor.config, preloaded, reads it at import, so the
# ranks that compile fork from the server too).
ONE_THREAD = {"OMP_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}


def base_env() -> dict[str, str]:
    """What every rank of `launch` inherits, and the rank server preloads under (tests/rankserver.py):
    this process's environment less an allocation's variables, and `ONE_THREAD`."""
    return {**{k: v for k, v in os.environ.items() if not allocation_variable(k)}, **ONE_THREAD}


# Taken again when the session starts (conftest), after the plugins set theirs (pytest-textual-snapshot's
# TEXTUAL_SNAPSHOT_TEMPDIR), before any test's own changes.
BASE_ENV = base_env()
BASE_CWD = os.getcwd()

Rank = subprocess.Popen | rankserver.ServedRank


def launch(
    argv: list[str],
    world: int,
    job_id: str = "t1",
    extra_env: Mapping[str, str | None] | None = None,
    *,
    cold: bool = False,
) -> list[Rank]:
    """`world` ranks of `python ARGV` on this machine (one torch thread each unless `extra_env`
    says otherwise; a None value there removes the variable). Each is forked by this process's
    warm rank server when that gives what a fresh interpreter gives (tests/rankserver.py says
    when), else started fresh (`cold=True`: always; CLUSTERFSDP_TEST_COLD=1: for every launch);
    either way a Popen-like object with the rank's stdout and stderr on `stdout` (text). A `-c CODE`
    rank runs CODE from a script file instead (`snippet_script`): the server forks scripts, not `-c`;
    with HF_HUB_OFFLINE=1 unless set, as the worker runs and the server imported (huggingface_hub
    reads it at import; nothing here downloads)."""
    port = free_port()
    if argv[:1] == ["-c"]:
        argv = [str(snippet_script(argv[1])), *argv[2:]]
        extra_env = {**({} if "HF_HUB_OFFLINE" in os.environ else {"HF_HUB_OFFLINE": "1"}), **(extra_env or {})}
    return [
        rankserver.start(
            [sys.executable, *argv], rank_env(rank, world, port, job_id, extra_env), BASE_ENV, BASE_CWD, cold
        )
        for rank in range(world)
    ]


def snippet_script(code: str) -> Path:
    """A file holding `code` (named by its hash, in a folder of this process's, made once): what
    a `python -c CODE` rank runs as `python FILE` (sys.argv[1:] the same; sys.path[0] that folder
    instead of '', which none of the tests' snippets imports from)."""
    global _SNIPPETS
    if _SNIPPETS is None:
        _SNIPPETS = Path(tempfile.mkdtemp(prefix="cfdp-snippets-"))
        atexit.register(_remove_snippets, _SNIPPETS, os.getpid())
    path = _SNIPPETS / f"snippet_{hashlib.sha256(code.encode()).hexdigest()[:16]}.py"
    if not path.exists():
        path.write_text(code)
    return path


def _remove_snippets(folder: Path, owner: int) -> None:
    """At exit of the process that made `folder`, not of a child forked from it (which inherits
    the atexit handler and may end while this process still launches from the folder)."""
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)


_SNIPPETS: Path | None = None


def rank_env(
    rank: int, world: int, port: int, job_id: str, extra_env: Mapping[str, str | None] | None = None
) -> dict[str, str]:
    """The environment `launch` gives a rank: this process's, torchrun's variables, `ONE_THREAD`."""
    env = {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "CLUSTERFSDP_JOB_ID": job_id,
        **ONE_THREAD,
        **(extra_env or {}),
    }
    return {k: v for k, v in env.items() if v is not None}


def inductor_env(cache: Path) -> dict[str, str]:
    """The environment of ranks that compile (`fsdp.compile`): inductor writes its generated code
    into `cache`, a folder of the test's own (so `compiled_layers` sees what this run compiled),
    and compiles in each rank's own process (its default pool of compile workers adds processes
    that import torch, and no speed on a small machine: the kernels are the same; every rank of
    `launch` has that already: `ONE_THREAD`)."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCHINDUCTOR_COMPILE_THREADS": "1"}


def compiled_layers(cache: Path) -> list[Path]:
    """The modules inductor generated under `cache` for a decoder layer: a Llama layer's RMSNorm
    computes rsqrt, the compiled loss does not. Empty when the layers ran eagerly."""
    return [p for p in cache.rglob("*.py") if "rsqrt" in p.read_text(errors="replace")]


def wait(procs: Sequence[Rank], timeout: float = 600) -> list[tuple[int, str]]:
    return [(p.wait(timeout=timeout), p.stdout.read() if p.stdout else "") for p in procs]


def run_snippet(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -c CODE ARGS...` as `subprocess.run(..., capture_output=True, text=True)` gives it,
    launched as one rank of `launch` (forked by the session's rank server when its rule allows:
    a snippet that imports torch and transformers, such as a model folder written with
    save_pretrained or a check on an export, is spared 4-5 s of imports). The differences: the
    rank's variables of `rank_env` and HF_HUB_OFFLINE=1 are set (nothing here downloads), and
    stdout and stderr are one stream, in both fields (a caller looks for its marked lines)."""
    (rank,) = launch(["-c", code, *args], 1)
    text = rank.stdout.read() if rank.stdout else ""  # (all of it before the wait: a full pipe would block it)
    status = rank.wait(timeout=timeout)
    return subprocess.CompletedProcess(["-c", code, *args], status, text, text)


def run_workers(run: runfolder.RunFolder, world: int, job_id: str = "t1") -> list[tuple[int, str]]:
    """All ranks of the worker on one run folder; asserts every rank exited 0."""
    out = wait(launch(["-m", "clusterfsdp.worker", str(run.path)], world, job_id))
    assert all(code == 0 for code, _ in out), "\n".join(text[-3000:] for _, text in out)
    return out


def losses(run: runfolder.RunFolder, job_id: str | None = None) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in run.metrics()}


def losses_by_attempt(run: runfolder.RunFolder) -> list[dict[int, float]]:
    """The losses of each attempt of a run, step -> loss (a new attempt starts where a step repeats:
    a resume from an earlier checkpoint)."""
    attempts: list[dict[int, float]] = [{}]
    for row in run.metrics():
        if attempts[-1] and row["step"] <= max(attempts[-1]):
            attempts.append({})
        attempts[-1][row["step"]] = row["loss"]
    return attempts


def newest_step(run: runfolder.RunFolder) -> int:
    """The step of the run's newest complete checkpoint; -1 when there is none."""
    info = ckptfolder.find(run.checkpoints_dir())
    return info.step if info is not None else -1


def write_safetensors(path: Path, tensors: dict[str, list[int]], truncate: int = 0) -> None:
    """A zero-filled float32 safetensors file written without torch (8-byte header length, JSON
    header, data); `truncate` drops bytes from the end, like an interrupted download."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = 4
        for n in shape:
            size *= n
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * (offset - truncate))


def weights_folder(path: Path) -> Path:
    """A folder that passes the pre-queue checks of a pretrained model (config.json + safetensors),
    for tests where the job must fail later, on the compute node."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(PRESETS["llama-tiny"]))
    write_safetensors(path / "model.safetensors", {"w": [2, 4]})
    return path


def newest_checkpoint(root: Path) -> ckptfolder.CheckpointInfo:
    """The newest complete checkpoint under `root` (the test fails if there is none)."""
    info = ckptfolder.find(root)
    assert info is not None, f"no complete checkpoint in {root}"
    return info


def on_a_tty(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    """`python -m clusterfsdp ARGS` with stdout and stderr on a pseudo-terminal (as a person runs
    it); everything it wrote there."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "clusterfsdp", *args], stdout=follower, stderr=follower, env=env)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the command closed the terminal
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=timeout)
    os.close(leader)
    return out.decode(errors="replace")
