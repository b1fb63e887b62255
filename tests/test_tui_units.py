"""The TUI's pure parts: log reading by offsets, the form model, estimates, plotting, metrics,
checkpoint listing and the queue join. No app is started here."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from tui_helpers import SINFO, FakeSlurm, job, make_run, write_bench

from clusterfsdp.core import slurmcli
from clusterfsdp.core import spec as S
from clusterfsdp.core.presets import PRESETS
from clusterfsdp.tui import form
from clusterfsdp.tui.bench_tail import BenchTail
from clusterfsdp.tui.checkpoints import scan
from clusterfsdp.tui.estimate import Memory
from clusterfsdp.tui.estimate import estimate as estimate_or_none
from clusterfsdp.tui.logtail import ERRORS, LogFile, compile_query
from clusterfsdp.tui.metrics_tail import MetricsTail
from clusterfsdp.tui.plot import Series, chart, labels, plain
from clusterfsdp.tui.queue_rows import collect
from clusterfsdp.tui.run_metrics import charts, decimate, smooth


def found(offset: int | None) -> int:
    """A search's hit, which the test expects to exist."""
    assert offset is not None
    return offset


# ---------------------------------------------------------------- logtail
@pytest.fixture
def log(tmp_path):
    """~2 MB of numbered lines with one traceback in the middle; chunks of 64 KB force many blocks."""
    lines = [f"line {i:06d} step {i} loss {i % 7}.0" for i in range(60_000)]
    lines[31_234] = "Traceback (most recent call last):"
    path = tmp_path / "rank0.log"
    path.write_text("\n".join(lines) + "\n")
    return path, lines


def test_tail_reads_only_the_end_and_starts_at_a_line(log):
    path, lines = log
    f = LogFile(path)
    chunk = f.tail(max_bytes=4096)
    assert chunk.lines[-1] == lines[-1] and chunk.lines[0] in lines and len(chunk.lines) < 200
    assert chunk.end == path.stat().st_size == f.end
    with open(path, "rb") as fh:  # offsets point at the lines they belong to
        fh.seek(chunk.offsets[5])
        assert fh.readline().decode().rstrip("\n") == chunk.lines[5]


def test_read_new_returns_only_appended_lines_and_rereads_a_partial_line(log):
    path, _ = log
    f = LogFile(path)
    f.tail()
    assert f.read_new().lines == []
    with open(path, "a") as fh:
        fh.write("new one\nhalf")
    chunk = f.read_new()
    assert chunk.lines == ["new one", "half"] and chunk.partial
    with open(path, "a") as fh:
        fh.write(" done\n")
    chunk = f.read_new()
    assert chunk.lines == ["half done"] and not chunk.partial and chunk.offsets[0] == f.end - len("half done\n")


def test_read_new_resets_when_the_file_shrinks_or_floods(log):
    path, _ = log
    f = LogFile(path)
    f.tail()
    path.write_text("rewritten\n")
    assert f.read_new().reset
    f.tail()
    with open(path, "a") as fh:
        fh.write("x" * 100 + "\n")
    assert f.read_new(max_bytes=50).reset


def test_search_forward_and_backward_cross_chunk_boundaries(log):
    path, lines = log
    f = LogFile(path, chunk_bytes=65536)
    size = path.stat().st_size
    hit = found(f.search_forward(ERRORS, 0))
    assert f.after(hit, 100).lines[0] == lines[31_234]
    assert f.search_backward(ERRORS, size) == hit
    assert f.search_forward(ERRORS, hit + 1 + len(lines[31_234])) is None
    assert f.search_backward(ERRORS, hit) is None
    q = compile_query("LINE 000007 ")  # capitals: case-sensitive, so no match
    assert f.search_forward(q, 0) is None
    q = compile_query("line 059999 ")
    assert f.after(found(f.search_forward(q, 0)), 100).lines[0] == lines[59_999]
    assert f.before(found(f.search_backward(compile_query("line 000000"), size)), 10**6).lines == []


def test_search_checks_every_candidate_line_with_the_pattern(tmp_path):
    """Literals only find candidates: 'Errors' and 'KilledBy' contain a literal of ERRORS but do
    not match it (word boundaries), so the search goes on to the real error, both ways."""
    lines = ["ok", "Errors: 0", "KilledBy nobody", "step 1 loss 2", "ValueError: bad", "Errors: 0", "ok"]
    path = tmp_path / "rank0.log"
    path.write_text("\n".join(lines) + "\n")
    f = LogFile(path)
    starts = [sum(len(x) + 1 for x in lines[:i]) for i in range(len(lines))]
    assert f.search_forward(ERRORS, 0) == starts[4]
    assert f.search_backward(ERRORS, path.stat().st_size) == starts[4]
    assert f.search_backward(ERRORS, starts[4]) is None
    assert f.search_forward(compile_query("valueerror"), 0) == starts[4]  # lower case: any case
    assert f.search_forward(compile_query("Valueerror"), 0) is None  # a capital: exact case


def test_before_after_and_around_give_adjacent_windows(log):
    path, lines = log
    f = LogFile(path)
    mid = found(f.search_forward(compile_query("line 030000 "), 0))
    above, below = f.before(mid, 2000), f.after(mid, 2000)
    assert above.lines[-1] == lines[29_999] and below.lines[0] == lines[30_000]
    assert above.end == mid == below.start
    around = f.around(mid, 8000)
    assert lines[30_000] in around.lines and around.lines.index(lines[30_000]) < len(around.lines) // 2


# ---------------------------------------------------------------- form
def test_every_schema_key_has_a_field_with_its_doc():
    for section in S.SECTIONS:
        if section == "env":
            assert form.BY_PATH["env"].kind == "toml"
            continue
        for key, f in S.section_fields(section).items():
            assert form.BY_PATH[f"{section}.{key}"].doc == f.metadata["doc"]
    kinds = {p: f.kind for p, f in form.BY_PATH.items()}
    assert kinds["slurm.nodes"] == kinds["slurm.time"] == "time" and kinds["fsdp.version"] == "choice"
    assert kinds["slurm.exclusive"] == "bool" and kinds["data.paths"] == "toml" and kinds["checkpoint.async"] == "bool"


def test_review_reports_validates_messages_by_field():
    raw = {f.path: form.display(f, f.default) for f in form.FIELDS}
    raw.update({"slurm.nodes": "0", "train.lr": "fast", "data.paths": '["a.txt"', "data.source": "synthetic"})
    r = form.review(raw)
    assert r.spec is None
    assert r.for_field("train.lr") == ["train.lr: expected number, found string 'fast'"]
    (paths_error,) = r.for_field("data.paths")
    assert paths_error.startswith("data.paths: not a TOML value")
    raw.update({"train.lr": "3e-4", "data.paths": "[]"})  # types fixed: validate's cross-field checks run
    assert form.review(raw).errors == ["slurm.nodes: must be >= 1, found 0"]
    raw.update({"slurm.nodes": "2", "train.lr": "3e-4", "data.paths": "[]", "slurm.time": "01:00:00"})
    r = form.review(raw)
    assert r.errors == [] and r.spec is not None
    assert r.spec.slurm.nodes == 2 and r.spec.slurm.time == "01:00:00"


def test_review_checks_the_model_and_tokenizer_folders_like_submit(tmp_path):
    """Relative to the job's folder; field-level messages; no network (the HF cache only)."""
    (tmp_path / "tok").mkdir()
    raw = {f.path: form.display(f, f.default) for f in form.FIELDS}
    raw.update({"model.name_or_path": "./no-model", "data.tokenizer": "tok"})
    r = form.check_sources(form.review(raw), tmp_path)
    assert r.spec is None
    assert r.for_field("model.name_or_path") == [f"model.name_or_path: '{tmp_path / 'no-model'}': no such folder"]
    assert r.for_field("data.tokenizer") == [
        f"data.tokenizer: {tmp_path / 'tok'} has no tokenizer files "
        "(tokenizer.json, tokenizer_config.json, tokenizer.model, vocab.json, vocab.txt)"
    ]
    raw.update({"model.name_or_path": "", "data.tokenizer": "bytes"})
    assert form.check_sources(form.review(raw), tmp_path).errors == []


def test_from_toml_round_trips_values_and_keeps_short_files_short(tmp_path):
    text = '[slurm]\nnodes = 2\ntime = "1-00:00:00"\nbogus = 1\n[train]\nlr = 3e-3\n[env]\nNCCL_DEBUG = "WARN"\n'
    opened = form.from_toml(text)
    assert opened.problems == ["slurm.bogus: unknown key (ignored)"]
    present = opened.present
    assert present == {"slurm.nodes", "slurm.time", "train.lr", "env"} and not opened.lists and not opened.sweep
    raw = {f.path: form.display(f, opened.values[f.path]) for f in form.FIELDS}
    r = form.review(raw)
    assert r.errors == []
    saved = form.dumps(form.to_data(r.values, keep=present))
    assert tomllib.loads(saved) == {
        "slurm": {"nodes": 2, "time": "1-00:00:00"},
        "train": {"lr": 0.003},
        "env": {"NCCL_DEBUG": "WARN"},
    }
    assert S.loads(saved).train.lr == 0.003


def test_errors_map_to_the_longest_field_path():
    assert form.field_of("slurm.extra.gres-flags: not an sbatch option name") == "slurm.extra"
    assert form.field_of("data.paths[0]: expected string") == "data.paths"
    assert form.field_of("env.1BAD: not a valid environment variable name") == "env"
    assert form.field_of("not valid TOML: x") is None
    assert form.field_of("sweep.grid train.lr: expected number, found string 'x'") == "train.lr"
    assert form.field_of('point 1 (data.paths=["a, b"] train.lr=0.1): train.steps: must be >= 1') == "train.steps"
    assert form.field_of("the sweep has 1001 points; at most 1000 (docs/sweeps.md): split it") is None


def test_a_sweeps_lists_open_check_point_by_point_and_save_as_its_grid(tmp_path):
    """[sweep] grid keys that are form fields open as lists of values (their text as --grid reads
    it); what else the table has is kept. Each point is checked as a job spec (a bad one named);
    saved, the lists are the grid again, in their order, and their first values the job's own."""
    text = (
        '[data]\nsource = "files"\n[train]\nsteps = 20\n[sweep]\nmax_parallel = 2\n'
        'grid = { "train.warmup" = [5, 50], "data.paths" = [["a, b.txt"], ["c.txt"]], '
        '"slurm.container.image" = ["x"] }\n'
    )
    opened = form.from_toml(text)
    assert opened.lists == {"train.warmup": "5, 50", "data.paths": '[["a, b.txt"], ["c.txt"]]'}
    assert opened.sweep == {"max_parallel": 2, "grid": {"slurm.container.image": ["x"]}}
    assert opened.values["train.warmup"] == 5 and opened.values["data.paths"] == ["a, b.txt"]  # the first values
    raw = {f.path: form.display(f, opened.values[f.path]) for f in form.FIELDS}
    lists = {"train.warmup": "5, -1", "data.paths": '["a.txt"], ["c.txt"]'}  # arrays as values: one TOML array
    r = form.review_job(raw, lists, {"max_parallel": 2}, tmp_path)
    assert r.for_field("data.paths")[-1] == 'sweep.grid data.paths: \'["a.txt"], ["c.txt"]\' is not a TOML array'
    lists["data.paths"] = '[["a.txt"], ["c.txt"]]'  # its first value stands for the job's own (paths = [] is not one)
    r = form.review_job(raw, lists, {"max_parallel": 2}, tmp_path)
    assert r.spec is None and r.sweep is None
    assert r.errors == ['point 2 (train.warmup=-1 data.paths=["a.txt"]): train.warmup: must be >= 0, found -1']
    assert r.for_field("train.warmup") == r.errors
    lists["train.warmup"] = "5, 10"
    r = form.review_job(raw, lists, {"max_parallel": 2}, tmp_path)
    assert r.errors == [] and r.sweep is not None and len(r.sweep.points) == 4
    assert [p.values for p in r.sweep.points[:2]] == [
        {"train.warmup": 5, "data.paths": ["a.txt"]},
        {"train.warmup": 5, "data.paths": ["c.txt"]},
    ]
    assert r.sweep.specs[1].data.paths == [str(tmp_path / "c.txt")]  # relative to the job's folder
    saved = tomllib.loads(form.dumps(form.to_data(r.values, keep={"train.steps"}, sweep=r.table)))
    grid = {"train.warmup": [5, 10], "data.paths": [["a.txt"], ["c.txt"]]}
    assert saved == {"data": {"source": "files", "paths": ["a.txt"]}, "train": {"steps": 20, "warmup": 5},
                     "sweep": {"max_parallel": 2, "grid": grid}}  # fmt: skip
    assert S.loads(form.dumps(saved)).data.paths == ["a.txt"]  # a job file `clusterfsdp sweep` takes


# ---------------------------------------------------------------- estimate, plot, metrics
def estimate(spec: S.JobSpec) -> Memory:
    m = estimate_or_none(spec)
    assert m is not None
    return m


def test_memory_estimate_shards_state_over_the_shard_group():
    spec = S.loads('[model]\npreset = "llama-1b"\n[slurm]\nnodes = 2\ngpus_per_node = 8\n[fsdp]\nsharding = "full"\n')
    m = estimate(spec)
    assert m is not None
    assert 1.2e9 < m.params < 1.3e9 and m.shard_group == 16
    assert m.state_bytes == pytest.approx(16 * m.params / 16)
    hybrid = estimate(S.loads('[model]\npreset = "llama-1b"\n[slurm]\nnodes = 2\ngpus_per_node = 8\n'))
    assert hybrid is not None
    assert hybrid.shard_group == 8 and hybrid.state_bytes == pytest.approx(2 * m.state_bytes)
    grad_op = estimate(
        S.loads('[model]\npreset = "llama-1b"\n[slurm]\ngpus_per_node = 8\n[fsdp]\nsharding = "grad_op"\n')
    )
    assert grad_op is not None
    assert grad_op.gathered_bytes == pytest.approx(2 * m.params)  # whole model in bf16
    assert estimate_or_none(S.loads('[model]\nname_or_path = "org/some-hub-model"\n')) is None


def test_memory_estimate_works_for_any_family(tmp_path):
    """From the config, not a Llama formula: a preset of another family, model_type + keys (a
    mixture of experts counts every expert: they all live in memory), a config folder."""
    assert 90_000 < estimate(S.loads('[model]\npreset = "gpt-neox-tiny"\n')).params < 150_000
    mixtral_8x7b = (
        '[model]\npreset = ""\nfrom_config = { model_type = "mixtral", hidden_size = 4096, intermediate_size = 14336, '
        "num_hidden_layers = 32, num_attention_heads = 32, num_key_value_heads = 8, vocab_size = 32000, "
        "num_local_experts = 8, num_experts_per_tok = 2 }\n[slurm]\ngpus_per_node = 8\n"
    )
    m = estimate(S.loads(mixtral_8x7b))
    assert 46.6e9 < m.params < 46.8e9 and m.state_bytes == pytest.approx(16 * m.params / 8)
    (tmp_path / "config.json").write_text(
        '{"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}'
    )
    gpt2 = estimate(S.loads(f'[model]\nconfig = "{tmp_path}"\n'))
    assert gpt2.params == 124_439_808  # GPT-2 small, exactly


def test_chart_draws_a_falling_curve_with_round_ticks():
    lines = [plain(line) for line in chart([Series([10, 20, 30, 40], [4.0, 3.0, 2.5, 2.0], "main")], 40, 8)]
    assert len(lines) == 8 and all(len(line) == 40 for line in lines)
    assert lines[0].startswith("4┤") and lines[3].startswith("3┤") and lines[6].startswith("2┤")
    assert lines[-1] == " └10          20           30         40"
    assert lines[0][2] != "\u2800" and lines[6][-1] != "\u2800"  # starts top-left, ends bottom-right


def test_tick_labels_are_round_and_compact():
    assert labels([0, 1e-4, 2e-4, 3e-4], 1e-4) == ["0", "1e-4", "2e-4", "3e-4"]
    assert labels([2.5e-4, 5e-4], 2.5e-4) == ["2.5e-4", "5.0e-4"]
    assert labels([20_000, 20_500, 21_000], 500) == ["20.0k", "20.5k", "21.0k"]
    assert labels([0, 10_000, 20_000], 10_000) == ["0", "10k", "20k"]
    assert labels([2.5, 2.75, 3.0], 0.25) == ["2.50", "2.75", "3.00"]
    assert labels([500, 1000, 1500], 500) == ["500", "1000", "1500"]


def test_chart_tags_each_cell_with_the_series_drawn_last_in_it():
    """A raw curve, its smoothed line and the eval loss share the axes; the widget colours cells
    by tag. The eval point at the last step lands in the bottom-right cell, drawn over the rest."""
    xs = list(range(10, 110, 10))
    raw = Series(xs, [5.0 - 0.3 * i + (0.4 if i % 2 else 0) for i in range(10)], "raw")
    main = Series(xs, smooth(list(raw.ys), 0.6), "main")
    evals = Series([50, 100], [3.0, 1.9], "eval")
    lines = chart([raw, main, evals], 30, 6)
    tags = {tag for line in lines for _, tag in line}
    assert tags == {"", "raw", "main", "eval"}
    bottom = lines[-2]
    assert bottom[-1][1] == "eval" and bottom[-1][0][-1] != "\u2800"


def test_decimation_keeps_spikes_and_the_ends():
    xs = list(range(1, 100_001))
    ys = [2.0 + (i % 7) / 100 for i in range(100_000)]
    ys[54_321] = 9.0  # one loss spike
    dx, dy = decimate(xs, ys)
    assert len(dx) <= 2000 and dx == sorted(dx) and (dx[0], dx[-1]) == (1, 100_000)
    assert 9.0 in dy and dx[dy.index(9.0)] == 54_322 and min(dy) == 2.0
    assert decimate(xs[:50], ys[:50]) == (xs[:50], ys[:50])


def test_smoothing_is_tensorboards_debiased_moving_average():
    assert smooth([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])  # no pull towards 0
    assert smooth([0.0, 10.0], 0.5) == pytest.approx([0.0, 5.0 / 0.75])
    assert smooth([1.0, 3.0], 0.0) == [1.0, 3.0]


def rows_of(tail: MetricsTail, *keys: str) -> list[tuple]:
    """(step, value of each key or None) per step, from the tail's columns."""
    m = tail.snapshot()
    return [(s, *(None if (v := m.columns[k][i]) != v else v for k in keys)) for i, s in enumerate(m.steps)]


def test_metrics_tail_reads_appended_rows_and_merges_eval_rows(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 10, "loss": 4.0}\n{"step": 20, "loss": 3.0}\n{"step": 30, "lo')
    tail = MetricsTail(path)
    assert tail.read_new() and rows_of(tail, "loss") == [(10, 4.0), (20, 3.0)]
    assert not tail.read_new()
    with open(path, "a") as f:  # the torn row completes; an eval row of its own for step 20
        f.write('ss": 2.0, "mfu": 0.41}\n{"step": 20, "eval_loss": 3.2, "eval_ppl": 24.5}\n')
    assert tail.read_new()
    assert rows_of(tail, "loss", "eval_loss", "eval_ppl", "mfu") == [
        (10, 4.0, None, None, None),
        (20, 3.0, 3.2, 24.5, None),  # the eval row keeps the step's training numbers
        (30, 2.0, None, None, 0.41),
    ]
    with open(path, "a") as f:  # eval before its step's training row; a training row with eval keys; junk
        f.write(
            '{"step": 40, "eval_loss": 2.5}\n{"step": 40, "loss": 1.9}\n{"step": 50, "loss": 1.8, "eval_loss": 2.4}\n'
        )
        f.write('{"step": 60, "loss": "nan?", "lr": true}\n{"no step": 1}\nnot json\n')
    assert tail.read_new()
    assert rows_of(tail, "loss", "eval_loss")[-2:] == [(40, 1.9, 2.5), (50, 1.8, 2.4)]
    m = tail.snapshot()
    assert (
        m.last_step == 50 and m.latest("eval_loss") == 2.4 and m.series("eval_loss") == ([20, 40, 50], [3.2, 2.5, 2.4])
    )


def test_metrics_tail_drops_the_steps_a_resumed_attempt_logs_again(tmp_path):
    """A resume from the checkpoint at step 20 logs step 30 again: the old 30..50 (and their eval
    losses) are not the history of the weights now training, so they go; 10 and 20 stay."""
    path = tmp_path / "metrics.jsonl"
    rows = [f'{{"step": {s}, "loss": {5 - s / 100}}}' for s in (10, 20, 30, 40, 50)] + ['{"step": 40, "eval_loss": 3}']
    path.write_text("\n".join(rows) + "\n")
    tail = MetricsTail(path)
    tail.read_new()
    with open(path, "a") as f:
        f.write('{"step": 30, "loss": 4.5}\n')
    tail.read_new()
    assert rows_of(tail, "loss", "eval_loss") == [(10, 4.9, None), (20, 4.8, None), (30, 4.5, None)]


def test_metrics_tail_reads_a_long_file_a_chunk_at_a_time(tmp_path):
    """Chunks far smaller than the file, and a line longer than a chunk (not a metrics row:
    skipped); every row around it is read once."""
    path = tmp_path / "metrics.jsonl"
    rows = [f'{{"step": {s}, "loss": {s / 10}}}' for s in range(1, 41)]
    rows.insert(20, '{"step": 999, "junk": "' + "x" * 200 + '"}')
    path.write_text("\n".join(rows) + "\n")
    tail = MetricsTail(path)
    assert tail.read_new(chunk_bytes=64)
    assert rows_of(tail, "loss") == [(s, s / 10) for s in range(1, 41)] and tail.offset == path.stat().st_size


def test_metrics_tail_thins_the_oldest_half_past_its_limit(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(f'{{"step": {s}, "loss": 1.0}}\n' for s in range(1, 1001)))
    tail = MetricsTail(path, max_points=800)
    tail.read_new()
    steps = list(tail.snapshot().steps)
    assert len(steps) == 750 and steps[-500:] == list(range(501, 1001)) and steps[:3] == [2, 4, 6]


def test_charts_title_latest_values_and_say_per_rank_without_gpus(tmp_path):
    run = make_run(tmp_path / "runs", eval_every=20)
    tail = MetricsTail(run.metrics_file)
    tail.read_new()
    metrics = tail.snapshot()
    loss, lr, grad_norm, tokens = charts(metrics, 0.6, "rank")
    assert loss.title.plain == "loss 2.5000  eval 2.8000"
    assert [s.tag for s in loss.series] == ["raw", "main", "eval"] and list(loss.series[2].xs) == [20, 40]
    assert lr.title.plain == "lr 3.00e-04" and [s.tag for s in lr.series] == ["main"]  # lr is never smoothed
    assert grad_norm.title.plain == "grad norm 0.500"
    assert tokens.title.plain == "tokens/s 24,000  12,000 per rank"
    assert charts(metrics, 0.0, "GPU")[3].title.plain.endswith("per GPU")
    assert [s.tag for s in charts(metrics, 0.0, "GPU")[0].series] == ["main", "eval"]


def test_a_preference_run_charts_its_reward_accuracy_with_the_held_out_one(tmp_path):
    """train.objective = "dpo" rows carry reward_accuracy, and evaluations eval_reward_accuracy:
    the second chart plots both (the learning rate moves to its title)."""
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "loss": 0.7, "lr": 1e-4, "reward_accuracy": s / 8} for s in range(1, 5)]
    rows.insert(2, {"step": 2, "eval_loss": 0.69, "eval_reward_accuracy": 0.5})
    rows.append({"step": 4, "eval_loss": 0.6, "eval_reward_accuracy": 0.75})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tail = MetricsTail(path)
    tail.read_new()
    second = charts(tail.snapshot(), 0.0, "rank")[1]
    assert second.title.plain == "reward accuracy 0.50  eval 0.75  lr 1.00e-04"
    assert [(s.tag, list(s.xs), list(s.ys)) for s in second.series] == [
        ("main", [1, 2, 3, 4], [0.125, 0.25, 0.375, 0.5]),
        ("eval", [2, 4], [0.5, 0.75]),
    ]


def test_a_kto_run_charts_its_reward_margin(tmp_path):
    """kto rows have no accuracy (no pairs): the second chart plots the reward margin and its
    held-out twin; a dpo row's margin does not displace its accuracy (the test above)."""
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "loss": 0.5, "lr": 1e-4, "reward_margin": s / 10, "kl": 0.1} for s in range(1, 4)]
    rows.append({"step": 3, "eval_loss": 0.4, "eval_reward_margin": 0.25, "eval_kl": 0.2})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tail = MetricsTail(path)
    tail.read_new()
    second = charts(tail.snapshot(), 0.0, "rank")[1]
    assert second.title.plain == "reward margin 0.300  eval 0.250  lr 1.00e-04"
    assert [(s.tag, list(s.xs), list(s.ys)) for s in second.series] == [
        ("main", [1, 2, 3], [0.1, 0.2, 0.3]),
        ("eval", [3], [0.25]),
    ]


def test_benchmark_scores_are_charted_beside_the_loss(tmp_path):
    """A run with benchmark results (two checkpoints, two scores and their standard errors): the
    chart beside the loss plots each score by checkpoint step in its own colour, the latest of
    each in the title (standard errors left out), the learning rate moved to the title; before
    any result it is the learning rate, and a preference run's reward accuracy gives way to them."""
    run = make_run(tmp_path / "runs")
    tail = MetricsTail(run.metrics_file)
    tail.read_new()
    metrics = tail.snapshot()
    assert charts(metrics, 0.6, "rank", [])[1].title.plain == "lr 3.00e-04"
    write_bench(run, 20, {"bench/mc/acc": 0.5, "bench/mc/acc_stderr": 0.2, "bench/mc/acc_norm": 0.25})
    write_bench(run, 40, {"bench/mc/acc": 0.75, "bench/mc/acc_stderr": 0.2, "bench/mc/acc_norm": 0.5})
    bench = BenchTail(run)
    assert bench.read_new()
    second = charts(metrics, 0.6, "rank", bench.rows())[1]
    assert second.key == "lr" and second.title.plain == "mc/acc 0.75  mc/acc_norm 0.5  lr 3.00e-04"
    assert [(s.tag, list(s.xs), list(s.ys)) for s in second.series] == [
        ("main", [20, 40], [0.5, 0.75]),
        ("eval", [20, 40], [0.25, 0.5]),
    ]
    nan = [{"step": 20, "bench/mc/acc": float("nan")}, {"step": 40, "bench/mc/acc": None}]  # no score computed
    assert charts(metrics, 0.6, "rank", nan)[1].title.plain == "lr 3.00e-04"
    preference = MetricsTail(tmp_path / "dpo.jsonl")
    (tmp_path / "dpo.jsonl").write_text(json.dumps({"step": 1, "loss": 0.7, "reward_accuracy": 0.5}) + "\n")
    preference.read_new()
    assert charts(preference.snapshot(), 0.0, "rank", bench.rows())[1].title.plain.startswith("mc/acc 0.75")
    assert charts(preference.snapshot(), 0.0, "rank", [])[1].title.plain.startswith("reward accuracy 0.50")


def test_bench_tail_reads_only_new_or_changed_results(tmp_path, monkeypatch):
    """Each poll reads the result files that appeared or changed (a rewritten step replaces its
    row, a removed one goes, a half-written one is read again once whole) and says whether any
    row changed; nothing new: False, and no file is read (the reads counted)."""
    from clusterfsdp.core import benchresults

    reads: list[str] = []
    read_document = benchresults.read_document
    monkeypatch.setattr(benchresults, "read_document", lambda path: reads.append(path.name) or read_document(path))
    run = make_run(tmp_path / "runs")
    bench = BenchTail(run)
    assert not bench.read_new() and bench.rows() == []  # no benchmarks/ folder yet
    write_bench(run, 20, {"bench/mc/acc": 0.5})
    assert bench.read_new() and [r["step"] for r in bench.rows()] == [20]
    assert not bench.read_new() and reads == ["step-20.json"]
    half = run.path / "benchmarks" / "step-40.json"
    half.write_text('{"step": 40, "metr')
    assert not bench.read_new() and [r["step"] for r in bench.rows()] == [20]
    write_bench(run, 40, {"bench/mc/acc": 0.75})
    write_bench(run, 20, {"bench/mc/acc": 0.25})  # evaluated again
    assert bench.read_new() and [(r["step"], r["bench/mc/acc"]) for r in bench.rows()] == [(20, 0.25), (40, 0.75)]
    assert sorted(reads) == ["step-20.json", "step-20.json", "step-40.json", "step-40.json"]
    (run.path / "benchmarks" / "step-20.json").unlink()
    assert bench.read_new() and [r["step"] for r in bench.rows()] == [40]


# ---------------------------------------------------------------- checkpoints, queue
def test_checkpoint_scan_lists_complete_partial_and_set_aside(tmp_path):
    run = make_run(tmp_path / "runs", checkpoints=(20, 40), partial=(60,))
    root = run.path / "checkpoints"
    (root / "set-aside" / "step-00000080-1767268900").mkdir(parents=True)
    (root / "set-aside" / "step-00000010-unreadable-1767268901").mkdir()  # ckptfolder.set_aside(..., why)
    rows = scan(root)
    assert [(r.step, r.state) for r in rows] == [
        (80, "set aside"), (60, "partial"), (40, "complete"), (20, "complete"), (10, "set aside")
    ]  # fmt: skip
    assert rows[2].size == 51_000 + len('{"step": 40, "saved": 1767268840.0, "world_size": 2}')
    assert rows[2].resumable and not rows[1].resumable


def test_collect_makes_one_squeue_and_one_sinfo_call_and_asks_sacct_only_for_jobs_that_left(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "20260101-120000-aaaa", executor="slurm", job_id="101", end=None)
    make_run(root, "20260101-110000-bbbb", executor="slurm", job_id="99", end=None)
    make_run(root, "20260101-100000-cccc", executor="local", job_id="5")
    slurm = FakeSlurm(
        jobs={"101": job("101", "RUNNING", "tiny-cpu"), "202": job("202", "PENDING", "eval", reason="Priority")},
        finished={"99": slurmcli.JobRow("99", "TIMEOUT", "", "10:00", "node1", "0:0")},
        sinfo=SINFO,
    )
    refresh = collect(root, slurm)
    rows = refresh.rows
    assert refresh.error == "" and slurm.sacct_ids == [["99"]]
    assert slurm.calls == {"squeue": 1, "sinfo": 1, "sacct": 1, "sacct-usage": 1}  # (one more: what runs cost)
    assert [(r.label, r.state) for r in rows] == [
        ("20260101-120000-aaaa", "RUNNING"),
        ("20260101-110000-bbbb", "TIMEOUT"),
        ("20260101-100000-cccc", "COMPLETED"),
        ("job 202", "PENDING"),
    ]
    assert rows[-1].key == "job:202" and rows[-1].run is None and "Priority" in rows[-1].reason
    assert re.match(r"tiny-cpu", rows[0].name) and rows[0].step == "40/40"
    assert [p.name for p in refresh.partitions or []] == ["gpu", "cpu", "debug"]


def test_collect_survives_slurm_being_down(tmp_path):
    root = tmp_path / "runs"
    make_run(root, executor="local")
    slurm = FakeSlurm(error="squeue: no answer within 30 s (is slurmctld up?)")
    refresh = collect(root, slurm)
    assert refresh.error.startswith("squeue: no answer") and refresh.rows[0].state == "COMPLETED"
    assert slurm.calls["sacct"] == slurm.calls["sinfo"] == 0 and refresh.partitions is None
    slurm = FakeSlurm(sinfo_error="sinfo: error: Invalid user for SlurmUser")  # squeue answers, sinfo fails
    refresh = collect(root, slurm)
    assert refresh.error == "" and refresh.cluster_error.startswith("sinfo: error") and refresh.rows


def test_preset_is_a_choice_fed_from_the_presets_table(monkeypatch):
    field = form.BY_PATH["model.preset"]
    assert field.kind == "choice" and field.choices == tuple(PRESETS)
    monkeypatch.setitem(PRESETS, "qwen-tiny", dict(PRESETS["llama-tiny"]))  # a family added to the table
    assert "qwen-tiny" in field.choices


def test_compose_summary_names_the_run_folder_the_job_will_get(tmp_path):
    """The summary's run folder is the one submit creates: run_root made absolute against the job
    file's folder (it showed `/name/<run id>/` for a job without run_root)."""
    from clusterfsdp.tui.job_summary import summarize

    for toml, root in (('[job]\nname = "x"\nrun_root = "rr"\n', tmp_path / "rr"), ('[job]\nname = "x"\n', None)):
        result = summarize(S.loads(toml), tmp_path, "local", False)
        root = root or Path(result.spec.job.run_root)
        assert root.is_absolute() and f"job        x -> {root}/x/<run id>/" in result.text, result.text
