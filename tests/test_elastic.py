"""Elastic starts (issue 39 item 3) without Slurm: `slurm.nodes = "MIN-MAX"` parsed, checked
to keep the global batch at every size and rendered again for `#SBATCH --nodes`, `slurm.time_min`,
the spec a worker runs on the allocation's size, the grow check's rule and the stop flag's
priority. The grow itself, on the devcluster's real daemons: tests/test_slurm_elastic.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterfsdp.control import launch
from clusterfsdp.core import runfolder
from clusterfsdp.core import spec as S
from clusterfsdp.core.records import Cause, Event, EventKind, Executor, attempt_sizes
from clusterfsdp.core.spec import nodes as N
from clusterfsdp.worker import distenv, elastic, stopflags
from clusterfsdp.worker.attempt import sized_spec as _sized

JOB = """
[job]
name = "el"
run_root = "RUNROOT"
[slurm]
nodes = "1-2"
tasks_per_node = 2
[data]
source = "synthetic"
[train]
micro_batch_size = 4
grad_accum = 1
"""


def load(*overrides: str, root: Path = Path("/tmp")) -> S.JobSpec:
    return S.loads(JOB.replace("RUNROOT", str(root)), list(overrides))


def errors(*overrides: str) -> list[str]:
    with pytest.raises(S.SpecError) as e:
        load(*overrides)
    return e.value.errors


@pytest.mark.parametrize(
    "value,low,high,rendered",
    [(2, 2, 2, "2"), ("2-8", 2, 8, "2-8"), (" 3 ", 3, 3, "3"), ("4-4", 4, 4, "4"), ("007-08", 7, 8, "7-8")],
)
def test_a_node_count_or_range_parses_and_renders_from_its_numbers(value, low, high, rendered):
    r = N.parse(value)
    assert (r.low, r.high, r.render(), r.elastic) == (low, high, rendered, low < high)


@pytest.mark.parametrize(
    "value,message",
    [
        ("8-2", "the range goes down; write '2-8'"),
        ("0-2", "the least node count is 1"),
        ("1,2,4", "node size lists ('1,2,4', '1-15:4') need Slurm 23.02 or newer"),
        ("1-15:4", "need Slurm 23.02 or newer"),
        ("2k", "expected a node count or a range 'MIN-MAX'"),
        ("1-2 --wrap=x", "expected a node count or a range 'MIN-MAX'"),
        ("1-200000", "at most 100,000 nodes"),
        (0, "must be >= 1, found 0"),
    ],
)
def test_a_bad_node_value_is_one_line_naming_the_key(value, message):
    with pytest.raises(S.SpecError) as e:
        S.loads("[data]\nsource = 'synthetic'\n", [f"slurm.nodes={value!r}" if isinstance(value, str) else
                                                  f"slurm.nodes={value}"])  # fmt: skip
    (line,) = e.value.errors
    assert line.startswith("slurm.nodes") and message in line, line


def test_validate_refuses_a_range_with_a_size_that_cannot_keep_the_global_batch_naming_those_that_can():
    """1-4 nodes at grad_accum 1 on the largest size: 3 nodes would need 4/3 micro-batches."""
    (line,) = errors("slurm.nodes='1-4'")
    assert line.startswith("slurm.nodes: '1-4': on 3 node(s) no whole train.grad_accum keeps the global batch 32")
    assert "sizes that work: 1, 2, 4; set slurm.nodes to a range of those ('1-2'), or train.grad_accum = 3" in line
    (line,) = errors("slurm.nodes='2-4'", "train.grad_accum=2")  # 8 micro-batch rounds: not on 3 nodes
    assert "on 3 node(s)" in line and "sizes that work: 2, 4;" in line and "train.grad_accum = 3" in line
    spec = load("slurm.nodes='1-4'", "train.grad_accum=3")  # what the refusal suggested works
    assert {n: spec.on_nodes(n).train.grad_accum for n in range(1, 5)} == {1: 12, 2: 6, 3: 4, 4: 3}
    assert {spec.on_nodes(n).global_batch for n in range(1, 5)} == {spec.global_batch} == {96}


def test_the_spec_of_an_attempt_is_its_allocations_size_with_the_same_global_batch():
    spec = load("fsdp.sharding='hybrid'")
    assert (spec.node_range.low, spec.node_range.high, spec.world_size, spec.mesh_shape) == (1, 2, 4, (2, 2))
    one, two = spec.on_nodes(1), spec.on_nodes(2)
    assert (one.slurm.nodes, one.train.grad_accum, one.world_size, one.mesh_shape) == (1, 2, 2, (2,))
    assert (two.slurm.nodes, two.train.grad_accum, two.mesh_shape) == (2, 1, (2, 2))
    assert one.global_batch == two.global_batch == spec.global_batch == 16
    with pytest.raises(ValueError, match="the allocation has 3 node"):
        spec.on_nodes(3)


def env_of(nodes: int, ranks: int) -> distenv.DistEnv:
    return distenv.DistEnv(0, 0, ranks, ranks // nodes, 0, nodes, "node1", 15000, "7", 0, "slurm")


def test_the_worker_reads_the_allocations_node_count_not_the_job_files(monkeypatch):
    """SLURM_JOB_NUM_NODES decides an elastic attempt's size; ranks that do not match it stop the
    attempt (silently wrong losses otherwise); a fixed count is left as the job file says."""
    spec = load()
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    sized = _sized(spec, env_of(1, 2))
    assert (sized.slurm.nodes, sized.train.grad_accum, sized.world_size) == (1, 2, 2)
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    assert _sized(spec, env_of(2, 4)).train.grad_accum == 1
    with pytest.raises(RuntimeError, match="the job step has 2 ranks on 1 node"):
        _sized(spec, env_of(1, 2))
    fixed = load("slurm.nodes=2")
    assert _sized(fixed, env_of(1, 2)) is fixed


def test_the_range_and_time_min_reach_the_sbatch_lines_rendered_from_parsed_values(tmp_path):
    spec = load("slurm.nodes=' 1-2'", "slurm.time=90", "slurm.time_min='0-00:45'", root=tmp_path / "runs")
    run = runfolder.create_run(spec, Executor.SLURM, run_id="RUNID")
    lines = launch.render_sbatch(spec, run).splitlines()
    assert [ln for ln in lines if ln.startswith("#SBATCH --nodes")] == ["#SBATCH --nodes=1-2"]
    assert "#SBATCH --time-min=45" in lines and "#SBATCH --time=90" in lines
    fixed = load("slurm.nodes='2'", root=tmp_path / "runs")
    lines = launch.render_sbatch(fixed, run).splitlines()
    assert "#SBATCH --nodes=2" in lines and not any(ln.startswith("#SBATCH --time-min") for ln in lines)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["slurm.time=30", "slurm.time_min=40"], "slurm.time_min: 40 min is longer than slurm.time (30 min)"),
        (["slurm.time_min=2"], "slurm.time_min: 2 min leaves no time before the save signal"),
        (["slurm.time_min='soon'"], "slurm.time_min: expected minutes or 'D-HH:MM:SS'"),
        (["slurm.extra={ time-min = '10' }"], "slurm.extra.time-min: managed by clusterfsdp: set slurm.time_min"),
        (["slurm.grow_check_s=1"], "slurm.grow_check_s: must be >= 5"),
        (["slurm.max_grows=-1"], "slurm.max_grows: must be >= 0"),
    ],
)
def test_time_min_and_the_grow_keys_are_checked(overrides, message):
    assert message in "\n".join(errors(*overrides))


def test_the_summary_says_how_a_range_starts_and_grows():
    from clusterfsdp.control.summary import summary

    text = summary(load("slurm.max_grows=1", "slurm.grow_check_s=30"), "Slurm")
    assert "resources  1-2 node(s) x 2 worker(s) (CPU) = 2-4 ranks" in text
    assert "elastic    starts on 1-2 nodes, whatever is free; grad_accum 2 on 1, 1 on 2 node(s) (global batch 16); " \
           "grows up to 1 time(s) when nodes come free (sinfo every 30 s)" in text  # fmt: skip


def test_more_than_one_node_needs_slurm_is_said_alike_by_the_summaries_and_the_local_backends(tmp_path):
    """The rule is one function (`JobSpec.needs_slurm`, issue 35): the TUI's summary names
    slurm.nodes as written, as validate does (it named the range's largest size), and the local
    executor and the notebook's local ranks refuse with the same words; one node needs nothing."""
    from clusterfsdp.control import backends
    from clusterfsdp.tui.job_summary import summarize

    said = "slurm.nodes = 1-2 needs Slurm"
    assert load().needs_slurm() == said and load("slurm.nodes=1").needs_slurm() == ""
    assert f"this machine (local executor) -- but {said}" in summarize(load(), tmp_path, "local", False).text
    for backend in (backends.Local(), backends.LocalRanks(lambda run: ([], {}))):
        with pytest.raises(launch.SubmitError, match=f"^{said}: "):
            backend.check(load())
        backend.check(load("slurm.nodes=1"))


def test_a_grow_is_found_by_two_checks_in_a_row_leaving_out_excluded_nodes():
    """The grow check's rule on sinfo's answers in turn: free nodes the job excludes do not count,
    and one answer alone (a node idle between two jobs) starts nothing."""
    answers = iter([{"node3"}, {"node2", "node3"}, {"node2", "node3"}])
    watch = elastic.GrowWatch(N.parse("1-4"), 1, 5, (0, 2), ("debug", {"node3"}), idle=lambda _: next(answers))
    assert watch.check() == ""  # only an excluded node is idle
    assert watch.check() == ""  # node2: seen once
    assert watch.check() == (
        "node2 free (sinfo, twice 5 s apart): growing from 1 to 2 node(s) of slurm.nodes = '1-4' "
        "(grow 1 of slurm.max_grows = 2)"
    )
    assert [elastic.target_size(N.parse("2-8"), 2, free) for free in (0, 1, 9)] == [None, 3, 8]


def test_grows_are_counted_from_the_events_and_bounded_by_max_grows(tmp_path):
    def ev(kind: EventKind, cause: Cause | None, restart: int = 0, **f) -> Event:
        return Event(kind, "7", restart, 0, "node1", 1.0, cause=cause, **f)

    events = [
        ev(EventKind.START, None, nodes=1, world_size=2),
        ev(EventKind.REQUEUED, Cause.GROW, step=5),
        ev(EventKind.START, None, 1, nodes=2, world_size=4),
        ev(EventKind.REQUEUED, Cause.TIME_LIMIT, 1, step=9),
    ]
    assert elastic.grows_used(events) == 1
    assert attempt_sizes(events) == {("7", 0): "1 node(s) x 2 = 2 ranks", ("7", 1): "2 node(s) x 2 = 4 ranks"}
    spec = load("slurm.max_grows=1")
    assert elastic.watch(spec, "7", 1, events) is None  # used up: no sinfo is ever asked
    assert elastic.watch(load(), "7", 2, []) is None  # already at the largest size


def test_a_grow_gives_way_to_a_signal_or_the_budget():
    flags = stopflags.StopFlags()
    flags.grow()
    assert flags.agree(None, 0, 60) == stopflags.STOP_GROW
    flags._set(stopflags.STOP_TERM)  # (what the SIGTERM handler does)
    assert stopflags.SIGNAL_NAMES[flags.agree(None, 1, 60)] == "SIGTERM"
    flags.grow()
    assert flags.value == stopflags.STOP_TERM
