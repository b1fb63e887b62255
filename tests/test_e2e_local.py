"""The first real run: jobs/tiny-cpu.toml through `clusterfsdp submit --follow` on submitit's
local executor (2 gloo worker processes, FSDP2), then runs/status/logs/export on its folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from procs import on_a_tty, run_snippet

from clusterfsdp.core import ckptfolder, runfolder


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
    assert node["warm_start"] is True  # forked from the controller that imported torch once (worker/warmctl.py)
    assert node["preflight"]["passed"] and node["preflight"]["busbw_gbps"] > 0  # worker/preflight.py, 2 ranks
    # the 2 ranks share this machine's CPUs for torch's threads (worker/threads.py), unless told
    shared = max(1, len(os.sched_getaffinity(0)) // 2)
    assert node["cpu_threads"] == int(os.environ.get("OMP_NUM_THREADS") or shared), node

    st = cli("status", str(run.path), cwd=tmp_path)
    assert st.returncode == 0 and "state      COMPLETED" in st.stdout and "checkpoints step 150" in st.stdout
    listing = cli("runs", "--run-root", str(tmp_path / "runs"), cwd=tmp_path)
    assert run.id in listing.stdout and "COMPLETED" in listing.stdout and "150/150" in listing.stdout
    log = cli("logs", run.id, "--run-root", str(tmp_path / "runs"), "--rank", "1", cwd=tmp_path)
    assert log.returncode == 0 and "Traceback" not in log.stdout

    out = tmp_path / "hf"
    ex = cli("export", str(run.path), "--to", str(out), cwd=tmp_path)
    assert ex.returncode == 0, ex.stderr
    assert "loading checkpoint step-00000150: done in" in ex.stdout  # progress as lines in a pipe
    shown = on_a_tty("export", str(run.path), "--to", str(tmp_path / "hf2"))  # a progress bar on a terminal
    assert "loading checkpoint step-00000150" in shown and "\r" in shown and ": done in" not in shown
    log = (run.logs_dir / f"{attempt.job_id}.0" / "rank0.log").read_text()
    assert "building the model (preset llama-tiny)" in log  # (tokenizing: whichever rank gets there first)
    assert f"warm start: forked from pid {attempt.job_id}, which imported torch and transformers in" in log
    assert "saving the final checkpoint (step 150) ..." in log
    assert "pre-flight: 1 node(s) passed (gpus, checkpoint space, /dev/shm, network)" in log
    check = f"""
import torch, torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer
from clusterfsdp.core import ckptfolder, runfolder
from clusterfsdp.core.spec import CheckpointSection
from clusterfsdp.worker import build, checkpoint, optimizer

text = "It is a truth universally acknowledged"
tok = AutoTokenizer.from_pretrained({str(out)!r})
ids = tok(text, return_tensors="pt").input_ids
assert ids[0].tolist() == list(text.encode()), ids  # the byte tokenizer's ids
m = AutoModelForCausalLM.from_pretrained({str(out)!r})
assert m.config.use_cache and (m.config.bos_token_id, m.config.eos_token_id, m.config.pad_token_id) == (256, 257, 258)
assert m.generation_config.eos_token_id == 257
assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
loss = m(input_ids=ids, labels=ids).loss.item()
assert loss < 3.5, loss   # the trained model knows the corpus; random init gives ~5.6
# the training model at that checkpoint gives the same logits
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
run = runfolder.RunFolder(__import__("pathlib").Path({str(run.path)!r}))
spec = run.spec()
model, _, _ = build.build_model(spec, torch.device("cpu"), 1, build.token_ids(spec), kept=run.model_dir, resume=True)
opt = optimizer.adamw(spec, model, torch.device("cpu"))
saver = checkpoint.Checkpointer(run.checkpoints_dir(), model, opt, CheckpointSection(keep_last=2))
saver.load(ckptfolder.find(run.checkpoints_dir()))
model.eval()
with torch.no_grad():
    torch.testing.assert_close(m(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
gen = m.generate(ids, max_new_tokens=20, do_sample=False)
print("GENERATED", repr(tok.decode(gen[0][ids.shape[1]:], skip_special_tokens=True)))
"""
    res = run_snippet(check)
    assert res.returncode == 0, res.stdout + res.stderr
    generated = res.stdout.split("GENERATED ", 1)[1].strip()
    assert len(generated) > 5, generated  # 20 new tokens of text

    again = cli("export", str(run.path), "--to", str(out), cwd=tmp_path)  # a non-empty --to is refused
    assert again.returncode == 2 and "not empty (use --force" in again.stderr
    forced = cli("export", str(run.path), "--to", str(out), "--force", "--dtype", "bfloat16", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    header = (out / "model.safetensors").read_bytes()[8:4000].decode(errors="replace")
    assert '"dtype":"BF16"' in header and "F32" not in header
    assert not list(tmp_path.glob(".hf.*"))  # nothing half-written left beside it

    shard = next(ck.path.glob("*.distcp"))  # a corrupt checkpoint: one line, exit 1
    shard.write_bytes(shard.read_bytes()[:100])
    broken = cli("export", str(run.path), "--to", str(tmp_path / "broken"), cwd=tmp_path)
    assert broken.returncode == 1 and "Traceback" not in broken.stderr, broken.stderr
    assert len(broken.stderr.strip().splitlines()) == 1 and broken.stderr.startswith("error: exporting step 150")
    assert not (tmp_path / "broken").exists()
    (ck.path / ".metadata").write_bytes(b"not DCP metadata")  # torch's DCP logged its traceback before the line
    broken = cli("export", str(run.path), "--to", str(tmp_path / "broken"), cwd=tmp_path)
    assert broken.returncode == 1 and "Traceback" not in broken.stderr, broken.stderr
    assert broken.stderr.strip().splitlines() == [broken.stderr.strip()] and ".metadata: SHA-256" in broken.stderr
