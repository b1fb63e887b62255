"""What `validate` accepts, trains (issue 40 item 1): jobs drawn over the cross product of the
features, each checked as a user checks it, the accepted ones trained on the local executor.

Each drawn job.toml (hypothesis, shrinking to a smallest failing job, whose job.toml is printed)
combines:

- data: text (.jsonl records, or with a one-document .txt), chat (native messages), a
  mixture (`[[data.sources]]`) of native chat, ShareGPT-mapped, Alpaca-mapped and text sources
  with drawn weights, or preference pairs (UltraFeedback-shaped, or mixed with an
  Anthropic-HH-shaped mapped source) trained with a drawn train.objective (dpo, ipo, simpo,
  orpo; kto is refused on pairs), or KTO's unpaired examples (kto; dpo is refused on them), the
  reference of dpo/ipo/kto drawn as the starting model's table or a live frozen copy); the byte tokenizer or a real BPE
  with a ChatML template; packing (auto, concat, documents), seq_len 16/32/64, data.overlong
  (split, truncate, drop);
- eval: none, a held-out fraction, or eval.paths; every_steps, batches, eval.samples (from the
  eval set or a samples_file);
- length: train.steps or train.epochs; micro-batch, grad_accum, 1 or 2 ranks;
- model: random init (llama-tiny, qwen2-tiny) or a pretrained tiny Qwen2 folder written by
  save_pretrained; model.dtype float32 or bfloat16; LoRA (target modules, r, base_dtype);
- FSDP version x sharding x mixed precision (fp32, bf16, fp16: CPU) x activation
  checkpointing x compile x cpu_offload x reshard_after_forward;
- checkpoints (every_steps, keep_last, keep_best, async), the numerical guard (nonfinite,
  spike thresholds and window, rollback_after), early stopping, the pre-flight;
- a sweep over one of those keys (two points, `clusterfsdp sweep --grid`);
- `[benchmarks]`: a local lm-eval task evaluated at each (or every second) checkpoint in the
  background; `clusterfsdp bench RUN --all` then waits for them, and every evaluated step has
  finite scores (at most BENCHED such draws per run: an evaluation is ~15 s of lm-eval).

Each job goes through `clusterfsdp validate` in this process (the sweeps: `clusterfsdp sweep`,
which checks every point first). A refused job must be refused with `error:` lines only, each
naming a key, exit 2. An accepted one is submitted (`clusterfsdp submit --executor local`: real
gloo ranks of submitit's local executor) and must complete: every step logged, an evaluation
where one is configured, the final checkpoint, the best one with keep_best, the samples files.

Cost: one tiny model, steps <= 4 (or epochs of a few steps), data generated once for the module,
its prepared datasets shared by every draw (their keys do not depend on the drawn knobs). At
least MIN_TRAINED jobs train per run (refused draws come on top). Measured on the 2-core VM: 40
trained in 319 s (5:28 for the pytest process) with nothing else running, 589 s beside other
sessions' tests; a job is ~8 s, most of it each rank's start (a fresh process importing torch
and transformers, as on a cluster: that is what is tested, so it is not shared between draws).

Seed: $CLUSTERFSDP_XPROD_SEED, else today's date (UTC, YYYYMMDD): one set of draws per day, the
same for every run that day. A failure prints the seed and the job.toml; reproduce it with
    CLUSTERFSDP_XPROD_SEED=<seed> python -m pytest tests/test_crossproduct.py
($CLUSTERFSDP_XPROD_TRAINED raises or lowers MIN_TRAINED, e.g. for a longer search)."""

from __future__ import annotations

import contextlib
import datetime
import io
import math
import os
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from data_helpers import WORDS, conversations, documents, make_tokenizer, write_jsonl
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st
from procs import CORPUS

from clusterfsdp import cli
from clusterfsdp.core import ckptfolder, runfolder

SEED = int(os.environ.get("CLUSTERFSDP_XPROD_SEED") or datetime.datetime.now(datetime.UTC).strftime("%Y%m%d"))
MIN_TRAINED = int(os.environ.get("CLUSTERFSDP_XPROD_TRAINED", "40"))
COMPILED = 1  # compiled jobs trained per run at most: inductor takes minutes on a loaded 2-core machine
BENCHED = 2  # draws with [benchmarks] trained per run at most: lm-eval's start and the export, per checkpoint
RUN_TIMEOUT_S = 600.0


# ---------------------------------------------------------------- the data and models, once
@dataclass
class World:
    """Files every draw reads: tokenizer, pretrained model, sources, eval sets, the shared cache."""

    root: Path
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def cache(self) -> Path:
        return self.root / "cache"


def _chats(rng: random.Random, n: int, turns: int) -> list[list[dict[str, str]]]:
    """Conversations of 1..turns user/assistant turns of random words (some longer than 64 tokens)."""
    out = []
    for _ in range(n):
        chat = []
        for _ in range(rng.randint(1, turns)):
            chat.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(2, 12)))})
            chat.append({"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(1, 10)))})
        out.append(chat)
    return out


def _pairs(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Preference pairs in UltraFeedback's shape: a prompt, and answers that repeat it."""
    out = []
    for _ in range(n):
        prompt = [{"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(2, 8)))}]
        answers = [[*prompt, {"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(1, 6)))}]
                   for _ in range(2)]  # fmt: skip
        out.append({"prompt": prompt[0]["content"], "chosen": answers[0], "rejected": answers[1]})
    return out


def _unpaired(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """KTO's unpaired examples: a prompt, a completion and whether it is desirable (both kinds)."""
    return [{"prompt": " ".join(rng.choices(WORDS, k=rng.randint(2, 8))),
             "completion": " ".join(rng.choices(WORDS, k=rng.randint(1, 6))), "label": i % 3 != 0}
            for i in range(n)]  # fmt: skip


def build_world(root: Path) -> World:
    """Sources of every kind (a few hundred samples each at seq_len 32), a BPE tokenizer with a
    ChatML template, and a tiny pretrained Qwen2 (save_pretrained, with that tokenizer)."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    world = World(root)
    rng = random.Random(40)
    f = world.files
    f["bpe"] = make_tokenizer(root / "bpe")
    tok = AutoTokenizer.from_pretrained(f["bpe"])
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(root / "qwen")
    tok.save_pretrained(root / "qwen")
    f["qwen"] = root / "qwen"
    f["text"] = write_jsonl(root / "text.jsonl", [{"text": d} for d in documents(160, seed=1)])
    f["story"] = root / "story.txt"
    f["story"].write_text(CORPUS.read_text()[:3000])
    long_chats = [{"messages": c} for c in _chats(rng, 40, 4)]
    f["chat"] = write_jsonl(root / "chat.jsonl", [*conversations(120, seed=2), *long_chats])
    f["sharegpt"] = write_jsonl(
        root / "sharegpt.jsonl",
        [{"conversations": [{"from": {"user": "human"}.get(m["role"], "gpt"), "value": m["content"]} for m in c]}
         for c in _chats(rng, 120, 3)],
    )  # fmt: skip
    f["alpaca"] = write_jsonl(
        root / "alpaca.jsonl",
        [{"instruction": " ".join(rng.choices(WORDS, k=3)), "input": rng.choice(["", "river"]), "output": w}
         for w in rng.choices(WORDS, k=150)],
    )  # fmt: skip
    f["eval_text"] = write_jsonl(root / "eval_text.jsonl", [{"text": d} for d in documents(40, seed=7)])
    f["eval_chat"] = write_jsonl(root / "eval_chat.jsonl", conversations(40, seed=7))
    f["pairs"] = write_jsonl(root / "pairs.jsonl", _pairs(rng, 160))
    f["eval_pairs"] = write_jsonl(root / "eval_pairs.jsonl", _pairs(rng, 40))
    f["hh_pairs"] = write_jsonl(  # Anthropic-HH's shape (no prompt) with ShareGPT's keys: a mapped source
        root / "hh_pairs.jsonl",
        [{k: [{"from": {"user": "human"}.get(m["role"], "gpt"), "value": m["content"]} for m in p[a]]
          for k, a in (("good", "chosen"), ("bad", "rejected"))} for p in _pairs(rng, 120)],
    )  # fmt: skip
    f["unpaired"] = write_jsonl(root / "unpaired.jsonl", _unpaired(rng, 160))
    f["eval_unpaired"] = write_jsonl(root / "eval_unpaired.jsonl", _unpaired(rng, 40))
    f["prompts"] = root / "prompts.txt"
    f["prompts"].write_text("quiet river\nsilver window garden\n")
    f["task"] = root / "task" / "pick.yaml"  # a local lm-eval task: which of two words follows
    f["task"].parent.mkdir()
    write_jsonl(root / "task" / "pick.jsonl", [{"q": " ".join(rng.choices(WORDS, k=4)), "choices": rng.sample(WORDS, 2),
                                               "answer": i % 2} for i in range(6)])  # fmt: skip
    f["task"].write_text(
        "task: xprod_pick\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: pick.jsonl\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{q}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n"
    )
    return world


# ---------------------------------------------------------------- the draws
SHAREGPT = {"messages_key": "conversations", "role_key": "from", "content_key": "value",
            "roles": {"human": "user", "gpt": "assistant"}}  # fmt: skip
ALPACA = {"prompt": "{instruction}\n\n{input}", "response": "{output}"}
HH = {"chosen_key": "good", "rejected_key": "bad", **{k: v for k, v in SHAREGPT.items() if k != "messages_key"}}
SWEEPS = {
    "train.lr": ("0.001", "0.003"),
    "train.grad_accum": ("1", "2"),
    "fsdp.mixed_precision": ("fp32", "bf16"),
    "data.seq_len": ("16", "32"),
}


@dataclass
class Draw:
    """One drawn job: its TOML tables, and the sweep grid (KEY=V1,V2) when it is a sweep."""

    tables: dict[str, Any]
    grid: str = ""

    def toml(self) -> str:
        import tomli_w

        return tomli_w.dumps(self.tables)


def rare(p: int) -> st.SearchStrategy[bool]:
    """True about one draw in p (a sweep trains twice, compile costs tens of seconds of inductor);
    False is the first choice, the one hypothesis favours and shrinks to."""
    return st.sampled_from([False] * (p - 1) + [True])


@st.composite
def draws(draw: st.DrawFn, world: World) -> Draw:
    f = world.files
    kind = draw(st.sampled_from(["text", "chat", "mixture", "preference", "unpaired"]))
    lora = draw(rare(3))
    pretrained = lora or draw(st.booleans())
    presets = st.sampled_from(["llama-tiny", "qwen2-tiny"])
    model: dict[str, Any] = {"name_or_path": str(f["qwen"])} if pretrained else {"preset": draw(presets)}
    model["dtype"] = draw(st.sampled_from(["float32", "float32", "bfloat16"]))
    data: dict[str, Any] = {
        "source": "files",
        "seq_len": draw(st.sampled_from([16, 32, 64])),
        "packing": draw(st.sampled_from(["auto", "concat", "documents"])),
        "overlong": draw(st.sampled_from(["split", "truncate", "drop"])),
        "cache_dir": str(world.cache),
        "prepare_workers": 1,
    }
    if not pretrained:
        byte_text = kind == "text" and draw(st.booleans())
        data["tokenizer"] = "bytes" if byte_text else str(f["bpe"])
    if kind == "text":
        data["paths"] = [str(f["text"])] + ([str(f["story"])] if draw(st.booleans()) else [])
    elif kind == "chat":
        data["paths"], data["format"] = [str(f["chat"])], "chat"
    elif kind == "preference":
        data["format"], data["packing"] = "preference", "auto"
        if draw(st.booleans()):
            data["paths"] = [str(f["pairs"])]
        else:  # a mixture: the answers' common leading messages are the prompt in both shapes
            data["prompt_key"] = ""
            data["sources"] = [{"path": str(f["pairs"]), "weight": draw(st.sampled_from([0.5, 1.0]))},
                               {"path": str(f["hh_pairs"]), **HH}]  # fmt: skip
    elif kind == "unpaired":  # KTO's examples
        data["format"], data["packing"], data["paths"] = "unpaired", "auto", [str(f["unpaired"])]
    else:
        data["format"] = "chat"
        kinds = st.sampled_from(["chat", "sharegpt", "alpaca", "text"])
        names = draw(st.lists(kinds, min_size=1, max_size=4, unique=True))
        data["sources"] = []
        for name in names:
            source: dict[str, Any] = {"path": str(f[name]), "weight": draw(st.sampled_from([0.2, 0.5, 1.0, 3.0]))}
            source.update(SHAREGPT if name == "sharegpt" else ALPACA if name == "alpaca" else {})
            if name == "text":
                source["format"] = "text"
            data["sources"].append(source)
    train: dict[str, Any] = {
        "micro_batch_size": draw(st.sampled_from([1, 2])),
        "grad_accum": draw(st.sampled_from([1, 2])),
        "lr": draw(st.sampled_from([1e-3, 3e-3])),
        "warmup": draw(st.sampled_from([0, 1])),
        "log_every": 1,
        "guard": {
            "nonfinite": draw(st.booleans()),
            "spike_loss": draw(st.sampled_from([0.0, 3.0])),
            "spike_grad_norm": draw(st.sampled_from([0.0, 5.0])),
            "spike_window": draw(st.sampled_from([2, 20])),
            "rollback_after": draw(st.sampled_from([0, 1, 3])),
        },
    }
    if kind == "preference":
        train["objective"] = draw(st.sampled_from(["dpo", "ipo", "simpo", "orpo", "dpo", "kto"]))
    elif kind == "unpaired":
        train["objective"] = draw(st.sampled_from(["kto", "kto", "kto", "dpo"]))  # (dpo on unpaired: refused)
    if train.get("objective") in ("dpo", "ipo", "kto"):  # the table of the starting model, or a frozen copy
        train["preference"] = {"reference": draw(st.sampled_from(["start", "start", "live"]))}
    if draw(st.booleans()):
        train["steps"] = draw(st.integers(2, 4))
    else:
        train["steps"], train["epochs"] = 0, draw(st.sampled_from([0.005, 0.01]))
    tables: dict[str, Any] = {"job": {"name": "x", "run_root": str(world.runs), "seed": draw(st.integers(0, 3))}}
    evaluation: dict[str, Any] = {}
    held = draw(st.sampled_from(["none", "fraction", "paths"]))
    if held == "fraction":
        evaluation["fraction"] = draw(st.sampled_from([0.1, 0.2, 0.3]))
    elif held == "paths":
        held_out = {"text": "eval_text", "preference": "eval_pairs", "unpaired": "eval_unpaired"}
        evaluation["paths"] = [str(f[held_out.get(kind, "eval_chat")])]
    if evaluation:
        evaluation["every_steps"] = draw(st.sampled_from([0, 1, 2]))
        evaluation["batches"] = draw(st.sampled_from([1, 2]))
        evaluation["samples"] = draw(st.sampled_from([0, 0, 1, 2]))
        evaluation["samples_max_new_tokens"] = 4
        if evaluation["samples"] and draw(st.booleans()):
            evaluation["samples_file"] = str(f["prompts"])
        if draw(rare(4)):
            train["early_stopping"] = {"metric": "eval_loss", "patience": 1}
    tables.update(model=model, data=data, train=train)
    if evaluation:
        tables["eval"] = evaluation
    if lora:
        tables["peft"] = {
            "method": "lora",
            "r": draw(st.sampled_from([2, 4])),
            "target_modules": draw(st.sampled_from(["all-linear", ["q_proj", "v_proj"]])),
            "base_dtype": draw(st.sampled_from(["", "bfloat16"])),
        }
    tables["fsdp"] = {
        "version": draw(st.sampled_from([2, 2, 1])),
        "sharding": draw(st.sampled_from(["hybrid", "full", "grad_op", "none"])),
        "mixed_precision": draw(st.sampled_from(["fp32", "bf16", "fp16"])),
        "activation_checkpointing": draw(st.booleans()),
        "compile": draw(rare(12)),
        "cpu_offload": draw(st.booleans()),
        "reshard_after_forward": draw(st.booleans()),
    }
    tables["slurm"] = {"tasks_per_node": draw(st.sampled_from([1, 2])), "preflight": draw(st.booleans())}
    tables["checkpoint"] = {
        "every_steps": draw(st.sampled_from([0, 1, 2])),
        "keep_last": draw(st.sampled_from([1, 2])),
        "keep_best": (
            draw(st.sampled_from(["eval_loss", "eval_reward_accuracy" if kind == "preference" else "eval_loss"]))
            if evaluation and draw(st.booleans())
            else ""
        ),
        "async": draw(st.booleans()),
    }
    if draw(rare(6)):
        tables["benchmarks"] = {
            "tasks": [str(f["task"])],
            "limit": 3,
            "every_checkpoints": draw(st.sampled_from([1, 2])),
        }
    grid = ""
    if draw(rare(6)):
        key = draw(st.sampled_from(sorted(SWEEPS)))
        grid = f"{key}={','.join(SWEEPS[key])}"
    return Draw(tables, grid)


# ---------------------------------------------------------------- one draw, as a user runs it
@dataclass
class Outcome:
    refused: list[str]  # the error lines of a refusal
    runs: list[runfolder.RunFolder]  # what trained (a sweep: its points)


def clusterfsdp(*argv: str) -> tuple[int, str, str]:
    """The CLI in this process (validate's checks are what submit and sweep run too)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


# `error: [FILE: ][point I (KEY=V): ]KEY...`: a sweep's refusal names its point first
KEYED = re.compile(r"error: (\S+\.toml: )?(point \d+ \([^)]*\): )?[a-z_]+(\.[a-z_]+|\[\d+\])*( \(|:| )")


def check_refusal(code: int, err: str) -> list[str]:
    """A refusal: exit 2, every stderr line an `error:` line naming a key (no traceback)."""
    lines = err.splitlines()
    assert code == 2 and lines, f"exit {code}, stderr:\n{err}"
    bad = [line for line in lines if not KEYED.match(line)]
    assert not bad, f"refusal lines that name no key (or are not error lines):\n{err}"
    return lines


def run_draw(d: Draw, path: Path) -> Outcome:
    """Validate (or plan the sweep), then train what was accepted and wait for it to end."""
    path.write_text(d.toml())
    if d.grid:
        code, out, err = clusterfsdp("sweep", str(path), "--grid", d.grid, "--executor", "local")
        if code:
            return Outcome(check_refusal(code, err), [])
        folder = Path(re.search(r"folder (\S+)", out)[1])  # type: ignore[index]
        runs = [p for p in sorted(folder.iterdir()) if (p / "state.json").is_file()]
        return Outcome([], [runfolder.RunFolder(p) for p in runs])
    code, out, err = clusterfsdp("validate", str(path), "--executor", "local")  # no wait on a busy controller
    if code:
        return Outcome(check_refusal(code, err), [])
    assert out.rstrip().endswith("ok"), out + err
    code, out, err = clusterfsdp("submit", str(path), "--executor", "local")
    assert code == 0, f"validate said ok, submit refused (exit {code}):\n{err}"
    return Outcome([], [runfolder.RunFolder(Path(re.search(r"folder (\S+)", out)[1]))])  # type: ignore[index]


def wait_final(run: runfolder.RunFolder) -> Any:
    """The run's status once it ended (a sweep's point waits for its turn: PENDING, not final)."""
    from clusterfsdp.control import status

    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        st_ = status.run_status(run)
        if st_.state.final:
            return st_
        time.sleep(0.5)
    raise AssertionError(f"{run.path}: not ended after {RUN_TIMEOUT_S:.0f} s")


def what_happened(run: runfolder.RunFolder) -> str:
    """The end of every rank's log, for the failure message."""
    logs = sorted(run.logs_dir.rglob("*.log"))
    return "\n".join(f"--- {p.relative_to(run.path)}\n" + "\n".join(p.read_text().splitlines()[-25:]) for p in logs)


def check_completed(run: runfolder.RunFolder) -> None:
    """The run ended COMPLETED, and did what its job asks: every step logged (finite losses where
    the step was not skipped), evaluations, the final and best checkpoints, the samples files."""
    from clusterfsdp.core import spec as S

    end = wait_final(run)
    assert end.state == "COMPLETED", f"{run.path}: {end.state} {end.reason}\n{what_happened(run)}"
    spec = S.load(run.job_toml)
    rows = [r for r in run.metrics() if "loss" in r or "skipped" in r]
    done = [e for e in run.events() if e.event.value == "completed"][-1]
    steps = [r["step"] for r in rows]
    assert steps and steps == sorted(set(steps)) and steps[-1] == done.step, (steps, done)
    if spec.train.epochs <= 0 and not done.reason:  # early stopping may end it sooner
        assert done.step == spec.train.steps
    assert all(math.isfinite(r["loss"]) for r in rows if "loss" in r and not r.get("skipped")), rows
    evals = [r for r in run.metrics() if "eval_loss" in r]
    if spec.eval.fraction or spec.eval.paths:
        assert evals and evals[-1]["step"] == done.step and all(math.isfinite(r["eval_loss"]) for r in evals), evals
    if spec.train.objective != "sft":  # preference training: the rewards in every row (kto: and its KL estimate)
        shown = "kl" if spec.train.objective == "kto" else "reward_accuracy"
        assert all(shown in r for r in rows if "loss" in r and not r.get("skipped")), rows
        # (kto's margin needs both kinds of example among those evaluated, as in TRL; its KL is always there)
        always = "eval_kl" if spec.train.objective == "kto" else "eval_reward_margin"
        assert all(math.isfinite(r[always]) and math.isfinite(r.get("eval_reward_margin", 0.0)) for r in evals), evals
    final = ckptfolder.find(run.checkpoints_dir(spec))
    assert final is not None and final.step == done.step
    if spec.checkpoint.keep_best:
        assert ckptfolder.best(run.checkpoints_dir(spec)) is not None
    if spec.eval.samples:  # one file per evaluation, each with a line per prompt (fewer: a smaller eval set)
        files = sorted((run.path / "samples").glob("step-*.jsonl"))
        assert len(files) == len(evals) and all(
            1 <= len(p.read_text().splitlines()) <= spec.eval.samples for p in files
        ), files
    if spec.benchmarks.tasks:
        check_benchmarks(run, final.step)


def check_benchmarks(run: runfolder.RunFolder, final_step: int) -> None:
    """The run's own evaluations (in the background) waited for by `bench --all`, which then
    evaluates the checkpoints left without a result: every one kept has finite scores, none failed."""
    from clusterfsdp.core import benchresults

    code, out, err = clusterfsdp("bench", str(run.path), "--all")
    assert code == 0, f"bench --all: exit {code}\n{out}{err}\n{what_happened(run)}"
    assert not benchresults.failures(run), benchresults.failures(run)
    scored = {row["step"]: row for row in benchresults.rows(run)}
    assert final_step in scored, (sorted(scored), out)
    assert all(math.isfinite(row["bench/xprod_pick/acc"]) for row in scored.values()), scored
    assert not list((run.path / "benchmarks").glob("*.lock")), "an evaluation left its lock"


# ---------------------------------------------------------------- the test
@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return build_world(tmp_path_factory.mktemp("xprod"))


def prepare_all(world: World) -> None:
    """Every dataset the draws can name, prepared once: validate then knows every size (it
    builds the sample index a drawn seq_len/packing/split needs from the prepared data)."""
    from clusterfsdp.core import spec as S
    from clusterfsdp.data import prepare

    f = world.files
    base = {"job": {"run_root": str(world.runs)}, "data": {"source": "files", "cache_dir": str(world.cache),
                                                          "prepare_workers": 1, "seq_len": 16}}  # fmt: skip
    recipes = [
        {"paths": [str(f["text"]), str(f["story"])], "tokenizer": "bytes"},
        {"paths": [str(f["text"])], "tokenizer": "bytes"},
        {"paths": [str(f["eval_text"])], "tokenizer": "bytes"},
    ]
    for tokenizer in (str(f["bpe"]), str(f["qwen"])):
        recipes += [
            {"paths": [str(f["text"]), str(f["story"])], "tokenizer": tokenizer},
            {"paths": [str(f["text"])], "tokenizer": tokenizer},
            {"paths": [str(f["eval_text"])], "tokenizer": tokenizer},
            {"paths": [str(f["eval_chat"])], "tokenizer": tokenizer, "format": "chat"},
            {"paths": [str(f["pairs"])], "tokenizer": tokenizer, "format": "preference"},
            {"paths": [str(f["eval_pairs"])], "tokenizer": tokenizer, "format": "preference"},
            {"paths": [str(f["unpaired"])], "tokenizer": tokenizer, "format": "unpaired"},
            {"paths": [str(f["eval_unpaired"])], "tokenizer": tokenizer, "format": "unpaired"},
            {"tokenizer": tokenizer, "format": "preference", "prompt_key": "",
             "sources": [{"path": str(f["pairs"])}, {"path": str(f["hh_pairs"]), **HH}]},
            {"tokenizer": tokenizer, "format": "chat",
             "sources": [{"path": str(f["chat"])}, {"path": str(f["sharegpt"]), **SHAREGPT},
                         {"path": str(f["alpaca"]), **ALPACA}, {"path": str(f["text"]), "format": "text"}]},
        ]  # fmt: skip
    import tomli_w

    for recipe in recipes:
        tables = {**base, "data": {**base["data"], **recipe}}
        if recipe.get("format") in ("preference", "unpaired"):  # (the pairs are longer than 16 tokens)
            objective = "dpo" if recipe["format"] == "preference" else "kto"
            tables["train"], tables["data"]["seq_len"] = {"objective": objective}, 64
        prepare.ensure(S.loads(tomli_w.dumps(tables)), log=lambda _: None)


@pytest.mark.timeout(3600)  # the whole search (pytest's 600 s is per test)
def test_every_drawn_job_that_validate_accepts_trains(world: World) -> None:
    """At least MIN_TRAINED drawn jobs train to completion; every refused one is refused in lines
    that name their keys (module docstring)."""
    prepare_all(world)
    print(f"cross-product seed {SEED} (CLUSTERFSDP_XPROD_SEED={SEED} reproduces these draws)")
    tally: Counter[str] = Counter()
    t0 = time.monotonic()

    @seed(SEED)
    @settings(max_examples=MIN_TRAINED * 3, deadline=None, database=None, print_blob=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(draws(world))
    def one(d: Draw) -> None:
        compiled, benched = d.tables["fsdp"]["compile"], "benchmarks" in d.tables
        if tally["trained"] >= MIN_TRAINED or (compiled and tally["compile"] >= COMPILED):
            return
        if benched and tally["benchmarks"] >= BENCHED:
            return
        note(f"seed {SEED}; the job.toml{' (sweep --grid ' + d.grid + ')' if d.grid else ''}:\n{d.toml()}")
        outcome = run_draw(d, world.root / "job.toml")
        if outcome.refused:
            note("refused:\n" + "\n".join(outcome.refused))
            tally["refused"] += 1
            return
        for run in outcome.runs:
            check_completed(run)
        tally.update(["trained", *features(d)])
        tally["runs"] += len(outcome.runs)

    one()
    print(f"cross-product: {dict(sorted(tally.items()))} in {time.monotonic() - t0:.0f} s")
    assert tally["trained"] >= MIN_TRAINED, tally
    assert all(tally[f"mixed_precision={mp}"] for mp in ("fp32", "bf16", "fp16")), tally  # bf16/fp16 on CPU too


def features(d: Draw) -> list[str]:
    """What a trained draw covered, for the tally the test prints (and checks for mixed precision)."""
    t, fsdp = d.tables, d.tables["fsdp"]
    flags = {
        "lora": "peft" in t, "mixture": "sources" in t["data"], "eval": "eval" in t, "sweep": bool(d.grid),
        "preference": "objective" in t["train"], "kto": t["train"].get("objective") == "kto",
        "reference=live": t["train"].get("preference", {}).get("reference") == "live",
        "epochs": bool(t["train"].get("epochs")), "ranks=2": t["slurm"]["tasks_per_node"] == 2,
        "compile": fsdp["compile"], "cpu_offload": fsdp["cpu_offload"], "ac": fsdp["activation_checkpointing"],
        "async": t["checkpoint"]["async"], "benchmarks": "benchmarks" in t,
    }  # fmt: skip
    return [f"mixed_precision={fsdp['mixed_precision']}", f"fsdp{fsdp['version']}", *(k for k, v in flags.items() if v)]
