"""`[eval] samples` (issue 23.6): at every evaluation the ranks generate greedily from a few
prompts on the sharded model, rank 0 writes `<run>/samples/step-N.jsonl` and TensorBoard's
text; the TUI's run screen shows the newest. Real: two gloo ranks training llama-tiny on the
shipped corpus, TensorBoard's own reader, the Textual pilot. (The chat fine-tune in test_chat.py
checks that a trained model's completion is its answer.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from data_helpers import make_tokenizer
from procs import make_run, run_workers, tiny_job_toml
from tui_helpers import FakeSlurm, open_run_screen, rendered, run_app, until
from tui_helpers import make_run as make_run_folder

from clusterfsdp.core import evalsamples
from clusterfsdp.core import spec as S
from clusterfsdp.core.evalsamples import EvalSample
from clusterfsdp.data import checks as datachecks
from clusterfsdp.data import samplestats
from clusterfsdp.tui.app import ClusterApp
from clusterfsdp.tui.eval_samples import EvalSamples

SAMPLED = """[eval]
fraction = 0.1
every_steps = 2
batches = 1
samples = 2
samples_max_new_tokens = 6
[log]
trackers = ["tensorboard"]
"""


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory: pytest.TempPathFactory):
    """4 steps on 2 ranks, evaluating (and generating) at steps 2 and 4."""
    run = make_run(tiny_job_toml("sampled", seed=5, steps=4, tail=SAMPLED), tmp_path_factory.mktemp("samples"))
    run_workers(run, world=2)
    return run


def test_every_evaluation_writes_its_samples_to_the_run_folder(sampled_run):
    assert evalsamples.steps(sampled_run.samples_dir) == [2, 4]
    first, last = (evalsamples.read(sampled_run.samples_dir, step) for step in (2, 4))
    assert [s.step for s in first + last] == [2, 2, 4, 4]
    assert [s.prompt for s in first] == [s.prompt for s in last]  # the fixed eval order's first samples
    assert all(s.prompt.strip() for s in first) and first[0].prompt != first[1].prompt
    # the byte tokenizer: 6 new tokens at most are 6 bytes; stopping at a special token may end it sooner
    assert all(len(s.completion.encode()) <= 6 for s in first + last)
    assert evalsamples.latest(sampled_run.samples_dir) == last


def test_samples_are_the_trained_models_greedy_completions(sampled_run, tmp_path):
    """The step-4 samples against the step-4 checkpoint (the final one: the same weights), exported
    and run by plain transformers, one greedy token at a time: each completion is what that model
    generates from its prompt, 6 tokens or up to a special token, and not empty."""
    import torch
    from transformers import AutoModelForCausalLM

    from clusterfsdp.data.tokens import BOS
    from clusterfsdp.worker import export

    assert export.main([str(sampled_run.path), "--step", "4", "--to", str(tmp_path / "hf")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    samples = evalsamples.read(sampled_run.samples_dir, 4)
    for s in samples:
        ids = list(s.prompt.encode())  # a prompt of 32 bytes holds no special token (they decode to nothing)
        assert len(ids) == 32, s
        new: list[int] = []
        with torch.no_grad():
            while len(new) < 6:
                token = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
                if token >= BOS:
                    break
                new.append(token)
        assert new and s.completion == bytes(new).decode(), (s, new)


def test_samples_reach_tensorboard_as_text(sampled_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(sampled_run.tensorboard_dir), size_guidance={"tensors": 0})
    acc.Reload()
    events = acc.Tensors("eval/samples/text_summary")
    assert [e.step for e in events] == [2, 4]
    table = events[-1].tensor_proto.string_val[0].decode()
    assert table.startswith("| prompt | completion |")
    for s in evalsamples.read(sampled_run.samples_dir, 4):
        assert s.prompt.replace("|", "\\|").replace("\n", "<br>") in table


def test_chat_prompts_from_a_file_are_rendered_with_the_chat_template(tmp_path):
    """No model needed: the prompts every rank encodes before training starts."""
    from clusterfsdp.worker.generate import PromptError, SampleGenerator

    tok = make_tokenizer(tmp_path / "tok")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "river stone"}) + "\n" + json.dumps({"prompt": "lamp"}) + "\n")
    text = f"""
[data]
source = "files"
paths = ["{tmp_path}"]
format = "chat"
tokenizer = "{tok}"
[eval]
fraction = 0.1
samples = 1
samples_file = "{prompts}"
"""
    gen = SampleGenerator(S.loads(text), None)
    assert [gen.decode(p) for p in gen.prompts] == ["<|im_start|>user\nriver stone<|im_end|>\n<|im_start|>assistant\n"]
    prompts.write_text("river stone\n")  # not JSON
    with pytest.raises(PromptError, match=r'line 1 is not a JSON object with a "prompt" string'):
        SampleGenerator(S.loads(text), None)


def test_samples_need_an_eval_set_and_a_prompt_file_that_exists(tmp_path):
    with pytest.raises(S.SpecError) as e:
        S.loads('[data]\nsource = "files"\npaths = ["x.txt"]\n[eval]\nsamples = 2\nsamples_file = "p.csv"\n')
    assert "eval.samples: generating at each evaluation needs an eval set" in str(e.value)
    assert "eval.samples_file: expected a .txt or .jsonl file" in str(e.value)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text\n" * 50)
    spec = S.loads(
        f'[data]\nsource = "files"\npaths = ["{corpus}"]\n[eval]\nfraction = 0.1\nsamples = 2\n'
        f'samples_file = "{tmp_path / "gone.txt"}"\n'
    )
    assert f"eval.samples_file: {tmp_path / 'gone.txt'} is not a file" in datachecks.problems(spec)


def test_run_screen_shows_the_newest_samples_and_the_epoch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A long prompt leaves the completion on screen; an epochs run shows the steps its rank 0
    counted (data.json) as its step total, not '?'."""
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs"
    run = make_run_folder(root, checkpoints=(20, 40))
    with run.metrics_file.open("a") as f:
        f.write(json.dumps({"step": 40, "loss": 2.5, "lr": 3e-4, "grad_norm": 0.5, "epoch": 1.25}) + "\n")
    text = run.job_toml.read_text()
    epochs = {"steps = 40\n": "steps = 0\n", "epochs = 0.0\n": "epochs = 2.0\n"}
    for old, new in {**epochs, 'source = "synthetic"': 'source = "files"'}.items():
        text = text.replace(old, new)
    run.job_toml.write_text(text.replace("paths = []\n", 'paths = ["/data/corpus.txt"]\n', 1))
    assert S.load(run.job_toml).train.epochs == 2
    samplestats.write(run.data_file, {}, None, 46)  # as the worker records it when the data opens
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        screen = await open_run_screen(pilot, app)
        table = screen.query_one(EvalSamples)
        await until(pilot, lambda: screen.facts is not None, "the run's files read")
        assert not table.display  # no samples yet: the room stays with the charts
        evalsamples.write(run.samples_dir, 20, [EvalSample(20, "old prompt", "old completion")])
        await until(pilot, lambda: table.step == 20, "the samples of step 20")
        newer = [EvalSample(40, "the river\nand", " the stone"), EvalSample(40, "a", "b")]
        evalsamples.write(run.samples_dir, 40, newer)
        await until(pilot, lambda: table.step == 40, "the newer samples of step 40")
        await pilot.pause()
        assert [table.get_row_at(i) for i in range(table.row_count)] == [["the river⏎ and", " the stone"], ["a", "b"]]
        assert table.display and "eval samples at step 40" in rendered(table)
        header = rendered(screen.query_one("#run-header"))
        assert "epoch 1.25" in header and "step 40/46" in header
        prompt = "words of a long prompt " * 9  # 207 characters: the prompt column stays narrow
        evalsamples.write(run.samples_dir, 60, [EvalSample(60, prompt, " the completion shows")])
        await until(pilot, lambda: table.step == 60, "the samples of step 60")
        await pilot.pause()
        shown = rendered(table)
        assert " the completion shows" in shown and "…" in shown and "long prompt" in shown

    run_app(app, scenario)
