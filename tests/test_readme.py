"""README.md's fine-tuning walk-through (issue 23), run as written: the shell block between its
markers, in an empty folder, with this checkout's `clusterfsdp` and `python` first on PATH.
Real: a Qwen2 and a tokenizer written by save_pretrained, two local CPU ranks, export, then
plain transformers' `generate`. Then its preference-training walk-through (issue 37) in the same
folder: DPO from the exported SFT model, export, `generate`; and its benchmarks walk-through
(issue 38): a local lm-eval task evaluated at each checkpoint of a run, in the background."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def walkthrough(name: str) -> str:
    """The ```sh block of README.md between `<!-- walkthrough: NAME -->` and `<!-- /walkthrough -->`."""
    text = (REPO / "README.md").read_text()
    found = re.search(rf"<!-- walkthrough: {name} -->\n```sh\n(.*?)```\n<!-- /walkthrough -->", text, re.S)
    assert found, f"README.md has no walk-through {name!r}"
    return found.group(1)


def run_walkthrough(name: str, folder: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERFSDP_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["XDG_CONFIG_HOME"] = str(folder / "config")  # no user config naming another run root
    env["HF_HUB_OFFLINE"] = "1"  # it downloads nothing
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", walkthrough(name)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_the_fine_tuning_preference_and_benchmark_walkthroughs_run_as_written(tmp_path: Path):
    done = run_walkthrough("fine-tuning", tmp_path)
    said = done.stdout + done.stderr
    assert "COMPLETED" in said and "train.epochs = 2: " in said, said[-3000:]
    assert re.search(r"^data +train samples: \d+ of seq_len 64 \(documents packing\).*% padding", said, re.M), said
    samples = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"step"')]
    assert samples and all(s["prompt"].endswith("<|im_start|>assistant\n") for s in samples), samples
    assert samples[-1]["completion"] == "yes", samples  # the eval samples: the trained answer
    assert done.stdout.splitlines()[-1] == "reply: yes", done.stdout[-2000:]
    assert "== train sample " in done.stdout and "[[yes<|im_end|>" in done.stdout  # data show: the answers

    dpo = run_walkthrough("preference", tmp_path)
    said = dpo.stdout + dpo.stderr
    assert "-- chosen --" in dpo.stdout and "[[no<|im_end|>" in dpo.stdout  # data show: the pair's answers
    assert "reference log-probs of the train pairs: " in said and "COMPLETED" in said, said[-3000:]
    assert re.search(r"^eval +step 12: eval_loss [\d.]+, reward accuracy 1\.00$", dpo.stdout, re.M), said  # no ppl
    before, after = (
        re.fullmatch(r"(\S+): log p\(yes\) (\S+), log p\(no\) (\S+)", line) for line in dpo.stdout.splitlines()[-2:]
    )
    assert before and after and (before[1], after[1]) == ("chat-model", "dpo-model"), dpo.stdout[-2000:]
    assert float(before[2]) > float(before[3]) and float(after[3]) > float(after[2]) + 5, dpo.stdout[-2000:]

    bench = run_walkthrough("benchmarks", tmp_path)
    said = bench.stdout + bench.stderr
    assert "[benchmarks]: evaluating step 12: in the background" in said and ": COMPLETED" in said, said[-3000:]
    # bench --all found both evaluations done or under way (the run's own): it ran none itself
    assert re.findall(r"^step (\d+): evaluated meanwhile$", bench.stdout, re.M) == ["12", "23"], bench.stdout[-3000:]
    assert "benchmark  step 23: bench/says_yes/acc 1\n" in bench.stdout, bench.stdout[-2000:]  # it learned "yes"
    (run,) = (tmp_path / "finetune" / "runs" / "bench").iterdir()
    assert sorted(p.name for p in (run / "benchmarks").glob("step-*.json")) == ["step-12.json", "step-23.json"]
    assert not list((run / "benchmarks").glob("*.lock")) and not list((run / "benchmarks").glob("*.failed.json"))
    # keep_best on the score: the best landed step (the first of the highest, as each result landed) exported
    scores = {s: json.loads((run / "benchmarks" / f"step-{s}.json").read_text())["metrics"]["bench/says_yes/acc"]
              for s in (12, 23)}  # fmt: skip
    best = max(scores, key=lambda s: (scores[s], -s))
    assert f"exported step {best} to " in said and (tmp_path / "finetune" / "best-model" / "config.json").is_file(), (
        scores, said[-2000:])  # fmt: skip
