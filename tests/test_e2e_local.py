"""The first real run: jobs/tiny-cpu.toml through `clusterfsdp submit --follow` on submitit's
local executor (2 gloo worker processes, FSDP2), then runs/status/logs/export on its folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from clusterfsdp.control import ckptfolder, runfolder


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clusterfsdp.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def test_tiny_cpu_job_trains_checkpoints_and_reports(tiny_job, tmp_path):
    r = cli("submit", str(tiny_job), "--executor", "local", "--follow", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "executor: local (requested)" in r.stderr
    assert "step 150/150" in r.stdout and ": COMPLETED" in r.stderr

    (run,) = runfolder.list_runs(tmp_path / "runs")
    rows = run.metrics()
    assert [row["step"] for row in rows] == list(range(10, 151, 10))
    assert rows[0]["loss"] - rows[-1]["loss"] > 1.0  # ~4.3 -> ~2.3 on the shipped corpus
    assert all(row["tokens_per_s"] > 0 for row in rows)
    assert {"step", "loss", "lr", "tokens_per_s", "time", "grad_norm", "mem_peak_gb"} <= rows[0].keys()

    (ck,) = ckptfolder.list_checkpoints(run.checkpoints_dir())
    assert ck.step == 150 and ck.meta["world_size"] == 2 and ck.meta["consumed"] == 150 * 2 * 8
    assert (ck.path / "rng" / "rank0.pt").is_file() and (ck.path / "rng" / "rank1.pt").is_file()

    (attempt,) = run.attempts
    assert attempt.executor == "local" and attempt.leader is not None
    logs = sorted(p.relative_to(run.path).as_posix() for p in run.logs_dir.rglob("*.log"))
    assert logs == [f"logs/{attempt.job_id}.0/rank0.log", f"logs/{attempt.job_id}.0/rank1.log"]
    node = json.loads(next(run.nodes_dir.rglob("*.json")).read_text())
    assert node["backend"] == "gloo" and node["dist"]["world_size"] == 2

    st = cli("status", str(run.path), cwd=tmp_path)
    assert st.returncode == 0 and "state      COMPLETED" in st.stdout and "checkpoints step 150" in st.stdout
    listing = cli("runs", "--run-root", str(tmp_path / "runs"), cwd=tmp_path)
    assert run.id in listing.stdout and "COMPLETED" in listing.stdout and "150/150" in listing.stdout
    log = cli("logs", run.id, "--run-root", str(tmp_path / "runs"), "--rank", "1", cwd=tmp_path)
    assert log.returncode == 0 and "Traceback" not in log.stdout

    out = tmp_path / "hf"
    ex = cli("export", str(run.path), "--to", str(out), cwd=tmp_path)
    assert ex.returncode == 0, ex.stderr
    check = f"""
import torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained({str(out)!r})
ids = torch.tensor([list(b"It is a truth universally acknowledged")])
loss = m(input_ids=ids, labels=ids).loss.item()
print(loss)
assert loss < 3.5, loss   # the trained model knows the corpus; random init gives ~5.6
assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
"""
    res = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
