"""The run folder: the one contract between submit, the workers, status, resume and the TUI.

    <run_root>/<job name>/<run id>/
        job.toml                 resolved spec, secrets redacted
        state.json               written by the CLI only: executor and every attempt's job id
        events.jsonl             written by rank 0 only: start / signal / checkpoint / requeue / end
        metrics.jsonl            one JSON object per logged step
        submitit/                submitit's folder (pickles, <job id>_<task>_log.out/err)
        logs/<job id>.<restart>/rank<R>.log      per-rank log of one attempt
        nodes/<job id>.<restart>/<host>.json     what each node chose (interface, HCAs, versions)
        model/                   copies of the model's config.json, generation_config.json and the
                                 tokenizer's files (never weights), sources.json: what hub ids resolved to
        checkpoints/step-<N>/    DCP checkpoints

Every path is derived from the run folder and a job id, so nothing needs a database.
Writes are atomic (temp file + rename) or append-only lines, so a crash never leaves a
half-written state file. See docs/run-folder.md.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import spec as specmod


class RunNotFound(LookupError):
    pass


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one line; a single write() of a short line is atomic on local filesystems and NFS appends."""
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line; a torn last line (writer killed mid-write) is skipped, not fatal."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return out


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


@dataclass(frozen=True)
class RunFolder:
    path: Path

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def name(self) -> str:
        return self.path.parent.name

    job_toml = property(lambda self: self.path / "job.toml")
    state_file = property(lambda self: self.path / "state.json")
    events_file = property(lambda self: self.path / "events.jsonl")
    metrics_file = property(lambda self: self.path / "metrics.jsonl")
    submitit_dir = property(lambda self: self.path / "submitit")
    logs_dir = property(lambda self: self.path / "logs")
    nodes_dir = property(lambda self: self.path / "nodes")
    model_dir = property(lambda self: self.path / "model")  # what export/resume need from the sources

    def checkpoints_dir(self, spec: specmod.JobSpec | None = None) -> Path:
        spec = spec or self.spec()
        return Path(spec.checkpoint.dir).expanduser() / self.id if spec.checkpoint.dir else self.path / "checkpoints"

    def spec(self) -> specmod.JobSpec:
        return specmod.load(self.job_toml)

    # ---- state.json (CLI-owned)
    def state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {"attempts": []}

    def write_state(self, state: dict[str, Any]) -> None:
        atomic_write(self.state_file, json.dumps(state, indent=2, sort_keys=True) + "\n")

    def add_attempt(self, **attempt: Any) -> dict[str, Any]:
        state = self.state()
        attempt.setdefault("submitted", time.time())
        attempt["attempt"] = len(state["attempts"])
        state["attempts"].append(attempt)
        self.write_state(state)
        return attempt

    def update_attempt(self, job_id: str, **changes: Any) -> None:
        state = self.state()
        for a in state["attempts"]:
            if a["job_id"] == job_id:
                a.update(changes)
        self.write_state(state)

    def ensure_attempt(self, job_id: str, executor: str) -> None:
        """Record a job the CLI did not submit (a dry-run script given to sbatch by hand); only the
        worker of a dry-run folder calls this, so it never races with `submit` writing state.json."""
        if not any(str(a["job_id"]) == job_id for a in self.attempts):
            self.add_attempt(job_id=job_id, executor=executor, reason="submitted by hand (sbatch)")

    @property
    def attempts(self) -> list[dict[str, Any]]:
        return self.state()["attempts"]

    @property
    def executor(self) -> str:
        return self.state().get("executor", "local")

    # ---- per-attempt files (derived from the job id and Slurm's restart count)
    def attempt_key(self, job_id: str, restart: int) -> str:
        return f"{job_id}.{restart}"

    def log_path(self, job_id: str, restart: int, rank: int) -> Path:
        return self.logs_dir / self.attempt_key(job_id, restart) / f"rank{rank}.log"

    def node_record(self, job_id: str, restart: int, host: str) -> Path:
        return self.nodes_dir / self.attempt_key(job_id, restart) / f"{host}.json"

    def log_files(self) -> list[Path]:
        """All per-rank logs, oldest attempt first."""
        return sorted(self.logs_dir.glob("*/rank*.log"), key=lambda p: (p.stat().st_mtime, p.name))

    # ---- worker-owned records
    def events(self) -> list[dict[str, Any]]:
        return read_jsonl(self.events_file)

    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.metrics_file)


def create_run(spec: specmod.JobSpec, executor: str, run_id: str | None = None) -> RunFolder:
    """Make the folder for a new run and write its resolved, redacted job.toml."""
    root = Path(spec.job.run_root).expanduser().resolve()
    run = RunFolder(root / spec.job.name / (run_id or new_run_id()))
    run.path.mkdir(parents=True, exist_ok=False)
    for sub in ("submitit", "logs", "nodes"):
        (run.path / sub).mkdir()
    atomic_write(run.job_toml, specmod.dumps(spec, redact=True))
    run.write_state(
        {"run_id": run.id, "name": spec.job.name, "executor": executor, "created": time.time(), "attempts": []}
    )
    return run


def iter_runs(run_root: str | Path) -> Iterator[RunFolder]:
    root = Path(run_root).expanduser()
    if not root.is_dir():
        return
    for state in root.glob("*/*/state.json"):
        yield RunFolder(state.parent.resolve())


def list_runs(run_root: str | Path) -> list[RunFolder]:
    """Runs under run_root, newest first (run ids start with their creation time)."""
    return sorted(iter_runs(run_root), key=lambda r: r.id, reverse=True)


def find_run(ref: str, run_root: str | Path = "./runs") -> RunFolder:
    """A run from its folder path, its id, or a unique prefix of its id."""
    p = Path(ref).expanduser()
    if (p / "state.json").is_file():
        return RunFolder(p.resolve())
    matches = [r for r in iter_runs(run_root) if r.id == ref] or [
        r for r in iter_runs(run_root) if r.id.startswith(ref)
    ]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise RunNotFound(f"no run {ref!r} under {Path(run_root).expanduser()} (give the run folder or set --run-root)")
    raise RunNotFound(f"{ref!r} matches {len(matches)} runs: {', '.join(r.id for r in matches[:5])}")
