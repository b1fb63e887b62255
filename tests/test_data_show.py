"""Seeing the training data (issue 40 item 3): `clusterfsdp data show JOB` decodes the samples a
job reads, in its order, the tokens its loss is computed on marked, per source of a mixture and
for the eval split; the TUI shows the same from Compose. The README's own epochs job opens in
Compose without a problem, and saves and submits unmodified.

Real: a byte-level BPE with a chat template saved by save_pretrained (data_helpers), data
prepared by the real prepare, the CLI in a subprocess, the Textual pilot. The README's
`tiny-qwen` folder is that tokenizer, a Qwen2 config.json and a safetensors file holding only
the embedding: the checks before queueing read no more, and nothing trains here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import numpy as np
import pytest
from data_helpers import WORDS, conversations, make_tokenizer, write_jsonl
from test_readme import walkthrough
from textual.widgets import Static
from tui_helpers import FakeSlurm, open_in_compose, open_run_screen, rendered, run_app, settle, until

from clusterfsdp.core import runfolder, warmlaunch
from clusterfsdp.core import spec as S
from clusterfsdp.core.records import Executor
from clusterfsdp.data import cache, mixsamples, prepare
from clusterfsdp.data.samples import PreparedSamples
from clusterfsdp.data.show import open_split, show
from clusterfsdp.data.tokens import IGNORE_INDEX
from clusterfsdp.tui import actions, data_screen
from clusterfsdp.tui.app import ClusterApp
from clusterfsdp.tui.data_screen import DataScreen

QWEN = {
    "model_type": "qwen2", "vocab_size": 400, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2,
}  # fmt: skip
MIX = """
[job]
name = "mix"
[model]
name_or_path = "tiny-qwen"
[data]
source = "files"
format = "chat"
seq_len = 64
[[data.sources]]
path = "sharegpt.jsonl"
weight = 0.7
messages_key = "conversations"
role_key = "from"
content_key = "value"
roles = { human = "user", gpt = "assistant" }
[[data.sources]]
path = "alpaca.jsonl"
weight = 0.3
prompt = "{instruction}"
response = "{output}"
[train]
micro_batch_size = 2
[eval]
fraction = 0.1
[slurm]
tasks_per_node = 1
"""


def readme_chat_toml() -> str:
    """The chat.toml the README's fine-tuning walk-through writes, as written there."""
    found = re.search(r"cat > chat.toml <<'EOF'\n(.*?)\nEOF\n", walkthrough("fine-tuning"), re.S)
    assert found, "the README's walk-through writes no chat.toml"
    return found.group(1) + "\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's fine-tuning folder (chat.toml as written, chat.jsonl, tiny-qwen) and a mixture
    of ShareGPT answers 'no <word>' and Alpaca answers '<word>!' beside it, all prepared."""
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("finetune")
    model = make_tokenizer(root / "tiny-qwen")
    (model / "config.json").write_text(json.dumps(QWEN))
    save_file({"model.embed_tokens.weight": np.zeros((400, 64), np.float32)}, str(model / "model.safetensors"))
    write_jsonl(root / "chat.jsonl", conversations(400))
    turns = [[{"from": "human", "value": f"{w} {w}"}, {"from": "gpt", "value": f"no {w}"}] for w in WORDS * 5]
    write_jsonl(root / "sharegpt.jsonl", [{"conversations": t} for t in turns])
    write_jsonl(root / "alpaca.jsonl", [{"instruction": f"say {w}", "output": f"{w}!"} for w in WORDS * 4])
    (root / "chat.toml").write_text(readme_chat_toml())
    (root / "mix.toml").write_text(MIX)
    for job in ("chat.toml", "mix.toml"):
        prepare.ensure(S.load(root / job, ["data.prepare_workers=1"]), log=lambda _: None)
    return root


def _labels(samples, position: int) -> np.ndarray:
    """The labels the ranks train on at a position of the order (what PreparedSamples.batch reads)."""
    if isinstance(samples, mixsamples.MixtureSamples):
        i, j = samples.schedule(position)
        part = samples.parts[i]
        return part.sample(part.index_of(j)).labels
    assert isinstance(samples, PreparedSamples)
    return samples.sample(samples.index_of(position)).labels


def _trained_text(document: list[tuple[str, bool]]) -> str:
    return "".join(text for text, trained in document if trained)


def test_the_marked_tokens_are_exactly_the_labels_the_ranks_train_on(folder):
    """Each shown sample marks as many tokens as the ranks' batch has labels, and they are the
    answers: 'yes' of the README's data, 'no <word>' and '<word>!' of the mixture's sources."""
    for job, split, source, answer in (
        ("chat.toml", "train", None, r"yes"),
        ("chat.toml", "eval", None, r"yes"),
        ("mix.toml", "train", None, r"(no \w+|\w+!)"),
        ("mix.toml", "train", 1, r"\w+!"),
        ("mix.toml", "eval", None, r"(no \w+|\w+!)"),
    ):
        spec = S.load(folder / job)
        shown = show(spec, job, split, source, 6)
        samples = open_split(spec, cache.dataset_refs(spec), split)
        if source is not None:
            assert isinstance(samples, mixsamples.MixtureSamples)
            samples = samples.parts[source]
        assert len(shown) == 6
        for position, sample in enumerate(shown):
            labels = _labels(samples, position)
            assert sample.trained == int((labels != IGNORE_INDEX).sum()), (job, split, source, position)
            for document in sample.documents:
                assert re.fullmatch(rf"{answer}<\|im_end\|>\n?", _trained_text(document)), document
        if job == "mix.toml" and source is None and split == "train":  # the mixture's order: both sources
            assert {"data.sources[0]" in s.title for s in shown} == {True, False}
        if source is not None:
            assert all("data.sources[1]" in s.title for s in shown)


def _cli(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """`clusterfsdp data show ARGS` in `folder`, the venv's bin on PATH (added only if missing: a
    PATH unlike the session's would make the warm launcher start `data show` cold)."""
    path, bindir = os.environ["PATH"], str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": path if bindir in path.split(os.pathsep) else f"{bindir}{os.pathsep}{path}"}
    env.pop("NO_COLOR", None)
    return subprocess.run(
        ["clusterfsdp", "data", "show", *args], cwd=folder, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_cli_brackets_trained_tokens_in_plain_text_and_refuses_in_one_line(folder):
    done = _cli(folder, "chat.toml", "-n", "2")
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stdout  # a pipe: no colour codes
    heads = [line for line in done.stdout.splitlines() if line.startswith("== train sample ")]
    assert len(heads) == 2 and "trained" in heads[0]
    assert "[[yes<|im_end|>" in done.stdout and "<|im_start|>user\n" in done.stdout
    # a source of a mixture, eval split of a job without one, data not prepared: one line, exit 2
    done = _cli(folder, "mix.toml", "--source", "1", "-n", "2", "--split", "eval")
    assert done.returncode == 0 and done.stdout.count("== eval data.sources[1]") == 2, done.stdout + done.stderr
    (folder / "more.jsonl").write_text((folder / "chat.jsonl").read_text() + json.dumps(conversations(1)[0]) + "\n")
    (folder / "more.toml").write_text(readme_chat_toml().replace("chat.jsonl", "more.jsonl"))
    for args, line in (
        (["more.toml"], "error: the train data is not prepared yet ("),
        (["chat.toml", "--source", "0"], "error: --source 0: the job reads one dataset (data.paths); --source"),
        (["mix.toml", "--set", "eval.fraction=0", "--split", "eval"], "error: --split eval: the job has no eval set"),
    ):
        done = _cli(folder, *args)
        assert done.returncode == 2 and done.stdout == "", done.stdout
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(line), done.stderr
    assert "prepare it with `clusterfsdp data prepare more.toml`" in _cli(folder, "more.toml").stderr


def test_compose_opens_the_readmes_epochs_job_unmodified_saves_submits_it_and_shows_its_data(
    folder, monkeypatch: pytest.MonkeyPatch
):
    """The form must not add train.steps' default beside the file's train.epochs: the README's
    job has no problem, is not 'modified', saves as the same TOML data and submits as is (the
    submit's spec recorded: the submit itself is the run service's, tested elsewhere). ctrl+t
    then shows its samples, the answers highlighted; t switches to the eval samples."""
    monkeypatch.chdir(folder)
    job = folder / "chat.toml"
    before = tomllib.loads(job.read_text())
    submitted: list[S.JobSpec] = []

    def record(spec, executor):
        submitted.append(spec)
        raise RuntimeError("recorded")

    monkeypatch.setattr(actions, "submit", record)
    app = ClusterApp(folder / "runs", slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        screen = await open_in_compose(pilot, app, job)
        assert screen.review is not None and screen.review.errors == [], screen.review.errors if screen.review else ""
        assert "(modified)" not in rendered(screen.query_one("#compose-file"))
        assert screen.summary is not None and "2 epochs" in screen.summary.text
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert tomllib.loads(job.read_text()) == before
        await pilot.press("ctrl+g")
        await until(pilot, lambda: len(app.screen_stack) > 1, "the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: submitted, "the submit")
        assert submitted[0].train.epochs == 2 and submitted[0].train.steps == 0
        await settle(pilot)
        await pilot.press("ctrl+t")
        data = app.screen
        assert isinstance(data, DataScreen)
        await until(pilot, lambda: data.samples or data.error, "the samples read")
        assert not data.error and len(data.samples) == 4
        trained = [text for s in data.samples for d in s["documents"] for text, t in d if t]
        assert trained and all(text.startswith("yes") for text in trained)
        body = data.query_one("#data-body", Static)  # the layout follows the update on a later frame
        await until(pilot, lambda: "<|im_start|>assistant" in rendered(body), "the samples on screen")
        await pilot.press("t")
        await until(pilot, lambda: data.split == "eval" and data.samples and "eval" in data.samples[0]["title"], "eval")
        await until(pilot, lambda: "eval samples" in rendered(data.query_one("#data-header")), "the eval header")

    run_app(app, scenario)


def test_the_run_screen_shows_the_data_of_the_selected_run(folder, monkeypatch: pytest.MonkeyPatch):
    """d on the Run screen: the samples of the run's own job.toml (absolute paths, its tokenizer).
    s pressed twice starts a read of source 0, then one of source 1; the first is held until the
    second is on screen, and must not replace it (CI once timed out here: source 0's read, the
    slower under load, ended last and stayed on screen). The hold is the only thing changed: both
    readers are real `data show` processes, forked by this session's warm launcher, which the
    test checks."""
    monkeypatch.chdir(folder)
    run = runfolder.create_run(S.load(folder / "mix.toml"), Executor.LOCAL)
    app = ClusterApp(folder / "runs", slurm=FakeSlurm(), refresh_s=3600)
    held, readers, handed, real_start = threading.Event(), [], [], data_screen.start_reader

    def start_reader(argv, out, err):
        if argv[-2:] == ["--source", "0"]:
            held.wait(120)
        reader = real_start(argv, out, err)
        readers.append((argv[-1], reader, threading.current_thread()))
        return reader

    def call_from_thread(callback, *args):  # returns once the app's thread has run the callback
        done = ClusterApp.call_from_thread(app, callback, *args)
        handed.append(threading.current_thread())
        return done

    monkeypatch.setattr(data_screen, "start_reader", start_reader)
    monkeypatch.setattr(app, "call_from_thread", call_from_thread)

    async def scenario(pilot):
        await open_run_screen(pilot, app)
        await pilot.press("d")
        data = app.screen
        assert isinstance(data, DataScreen) and data.job == run.job_toml
        await until(pilot, lambda: data.samples or data.error, "the samples read")
        assert not data.error and {"data.sources[0]" in s["title"] for s in data.samples} == {True, False}
        await pilot.press("s")  # the mixture's second source alone
        await pilot.press("s")
        await until(pilot, lambda: data.samples and "data.sources[1]" in data.samples[0]["title"], "source 1")
        assert all("data.sources[1]" in s["title"] for s in data.samples)
        await until(pilot, lambda: "data.sources[1]" in rendered(data.query_one("#data-header")), "source 1's header")
        handed.clear()
        held.set()  # source 0's read goes on: its reader is killed, or it ends and hands its samples over
        await until(pilot, lambda: any(which == "0" for which, _, _ in readers), "source 0's reader")
        ((reader, thread),) = [(r, t) for which, r, t in readers if which == "0"]
        assert all(isinstance(r, warmlaunch.Served) for _, r, _ in readers)  # forked, not new interpreters

        def ended() -> bool:
            code = getattr(reader, "returncode", None)
            return code is not None and (code < 0 or thread in handed)

        await until(pilot, ended, "source 0's read")
        await settle(pilot)
        assert data.source == 1 and all("data.sources[1]" in s["title"] for s in data.samples)
        assert "data.sources[1]" in rendered(data.query_one("#data-header"))

    run_app(app, scenario)
