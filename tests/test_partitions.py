"""The cluster's partitions from one sinfo call (control/partitions.py), and Slurm's error lines.

The sinfo text here is what Slurm 22.05 prints for `sinfo -h -O <SINFO_FORMAT>` (field size 0:
whole values; `|` a suffix), with GRES strings in the forms its gres code writes: typed counts
with sockets, GPU indices in use, `(null)` types on GPUs with topology but no type. A fake
`sinfo`/`squeue` on PATH stands in for the commands, since no Slurm controller answers here
(`test_sinfo_against_the_devcluster` runs the real one, with `-m slurm`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from tui_helpers import SINFO

from clusterfsdp.control import partitions as P
from clusterfsdp.core import slurmcli


@pytest.mark.parametrize(
    "text, gpus, types",
    [
        ("gpu:8", 8, ()),
        ("gpu:h100:8(S:0-1)", 8, ("h100",)),
        ("gpu:a100:4(S:0),gpu:a100:4(S:1),nic:2", 8, ("a100",)),
        ("gpu:2(S:0,2)", 2, ()),  # a comma inside the socket list is not an entry separator
        ("gpu:nvidia_a100_1g.10gb:7", 7, ("nvidia_a100_1g.10gb",)),  # a MIG type name with a dot
        ("gpu:h100:3(IDX:0-2)", 3, ("h100",)),  # GresUsed
        ("gpu:(null):0(IDX:N/A)", 0, ()),  # GresUsed of untyped GPUs with topology
        ("gpu:h100:0(IDX:N/A),gpu:a100:2(IDX:0-1)", 2, ("h100", "a100")),
        ("gpu", 1, ()),  # slurm.conf's Gres=gpu
        ("mps:400,shard:16", 0, ()),
        ("(null)", 0, ()),
        ("", 0, ()),
    ],
)
def test_gres_strings_count_gpus(text, gpus, types):
    assert P.parse_gres(text) == P.Gres(gpus, types)


def test_a_gres_string_it_cannot_read_is_an_error_not_a_guess():
    with pytest.raises(P.SinfoError, match="gpu:a:b:c"):
        P.parse_gres("gpu:a:b:c")


@pytest.mark.parametrize(
    "state, use",
    [
        ("idle", "idle"),
        ("idle~", "idle"),  # powered down: started on demand
        ("idle*", "unavailable"),  # not responding
        ("mixed", "mixed"),
        ("mixed-", "mixed"),  # planned (23.x suffix)
        ("allocated", "allocated"),
        ("completing", "allocated"),
        ("planned", "allocated"),
        ("drained", "unavailable"),
        ("draining", "unavailable"),
        ("down*", "unavailable"),
        ("maint", "unavailable"),
        ("reboot^", "unavailable"),
        ("idle+drain", "unavailable"),
        ("mixed+completing", "mixed"),
        ("inval", "unavailable"),
    ],
)
def test_node_states_mean_what_a_new_job_can_use(state, use):
    assert P.node_use(state) == use


def test_sinfo_groups_sum_per_partition():
    gpu, cpu, debug = P.parse(SINFO)
    assert (gpu.name, gpu.default, gpu.available, gpu.time_limit) == ("gpu", True, "up", "2-00:00:00")
    assert (gpu.nodes_idle, gpu.nodes_mixed, gpu.nodes_allocated, gpu.nodes_unavailable) == (2, 1, 4, 1)
    assert gpu.nodes_total == 8 and gpu.gpus_total == 64 and gpu.gpu_types == ("h100",)
    assert gpu.gpus_free == 2 * 8 + (8 - 3)  # idle nodes' GPUs, and what the mixed node has left
    assert gpu.gpus_max_per_node == 8 and (gpu.cpus_free, gpu.cpus_total) == (160, 512)
    assert (cpu.default, cpu.gpus_total, cpu.gpus_free, cpu.nodes_idle, cpu.cpus_free) == (False, 0, 0, 6, 384)
    assert not debug.up and debug.nodes_idle == 2


def test_the_command_asks_for_whole_fields_split_by_a_suffix():
    assert P.SINFO_COMMAND == [
        "sinfo",
        "-h",
        "-O",
        "Partition:0|,Available:0|,Time:0|,Nodes:0|,StateLong:0|,CPUsState:0|,Gres:0|,GresUsed:0",
    ]


@pytest.mark.parametrize(
    "line",
    ["gpu*|up|1:00:00|2|idle|0/1/0/1|gpu:2", "gpu*|up|1:00:00|two|idle|0/1/0/1|gpu:2|gpu:0", "PARTITION AVAIL"],
)
def test_a_line_it_cannot_read_is_an_error_naming_the_line(line):
    with pytest.raises(P.SinfoError, match=r"expected 8 fields|cannot read"):
        P.parse(line)


def fake_command(bindir: Path, name: str, stdout: str = "", stderr: str = "", code: int = 0) -> None:
    """An executable `name` on PATH that prints fixed text: stands in for a Slurm client."""
    bindir.mkdir(exist_ok=True)
    (bindir / f"{name}.out").write_text(stdout)
    (bindir / f"{name}.err").write_text(stderr)
    script = bindir / name
    script.write_text(f'#!/bin/sh\ncat "{bindir}/{name}.out"\ncat "{bindir}/{name}.err" >&2\nexit {code}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_query_runs_sinfo_once_and_reports_unreadable_output_as_a_slurm_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    fake_command(tmp_path / "bin", "sinfo", stdout=SINFO)
    assert [p.name for p in P.query_partitions()] == ["gpu", "cpu", "debug"]
    fake_command(tmp_path / "bin", "sinfo", stdout="gpu* up 1:00:00 2 idle\n")
    with pytest.raises(slurmcli.SlurmError, match=r"^sinfo: expected 8 fields"):
        P.query_partitions()


def test_slurm_error_lines_name_the_command_once(tmp_path, monkeypatch):
    """Slurm's clients start their errors with their own name ("squeue: error: ..."): the
    SlurmError must not say it twice (the status line read "squeue: squeue: error")."""
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(slurmcli.ENV_RETRY_S, "0")  # a transient error, not retried: Slurm's own line
    message = "squeue: error: Unable to contact slurm controller (connect failure)"
    fake_command(tmp_path / "bin", "squeue", stderr=message + "\n", code=1)
    with pytest.raises(slurmcli.SlurmError) as e:
        slurmcli.run(["squeue", "-h"])
    assert str(e.value) == message
    fake_command(tmp_path / "bin", "squeue", stderr="Invalid user\n", code=1)  # one without the name gets it
    with pytest.raises(slurmcli.SlurmError, match=r"^squeue: Invalid user$"):
        slurmcli.run(["squeue", "-h"])


@pytest.mark.slurm
def test_sinfo_against_the_devcluster(slurm_cluster, monkeypatch):
    """The real sinfo of the test cluster (Slurm 22.05): the format is accepted and every
    partition, node, CPU and (configured, fake) GPU is accounted for: each partition spans every
    node (slurm/slurm.conf.in: Nodes=ALL), each with the CPUs and `gpu` GRES that devcluster.sh
    configured (CFDC_CPUS, CFDC_GPUS: slurm/gres.conf.in), so a parser that finds no GPU fails."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.slurm_conf))
    found = P.query_partitions()
    assert [p.name for p in found] == ["debug", "low", "high"]
    assert [p.name for p in found if p.default] == [slurm_cluster.partition]
    nodes = len(slurm_cluster.nodes)
    assert slurm_cluster.gpus_per_node >= 1 and slurm_cluster.cpus_per_node >= 1
    for p in found:
        assert p.up and p.nodes_total == nodes, p
        assert p.gpus_total == nodes * slurm_cluster.gpus_per_node, p
        assert p.gpus_max_per_node == slurm_cluster.gpus_per_node, p
        assert p.cpus_total == nodes * slurm_cluster.cpus_per_node, p
        assert p.cpus_total >= p.cpus_free >= 0 and p.gpus_total >= p.gpus_free >= 0, p
