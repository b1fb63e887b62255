"""Cluster: the partitions you can submit to and what they have free now: idle, mixed,
allocated and unavailable nodes, free GPUs and CPUs. Read with the queue's refresh (one sinfo
call), so it is as fresh as the queue and costs the controller one more cheap call."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static, TabbedContent

from clusterfsdp.control.partitions import Partition

from .compose_screen import ComposeScreen
from .field_editor import editor_id
from .nav_bar import NavBar
from .status_line import StatusLine

if TYPE_CHECKING:
    from .app import ClusterApp

COLUMNS = (
    ("name", "PARTITION"),
    ("time", "TIME LIMIT"),
    ("idle", "IDLE NODES"),
    ("mixed", "MIXED"),
    ("allocated", "ALLOC"),
    ("down", "DOWN"),
    ("gpus", "FREE GPUS"),
    ("cpus", "FREE CPUS"),
)


def cells(p: Partition) -> tuple:
    name = Text(p.name + ("*" if p.default else ""), style="" if p.up else "red")
    if not p.up:
        name.append(f" ({p.available})")
    return (
        name,
        p.time_limit,
        Text(f"{p.nodes_idle}/{p.nodes_total}", style="bold green" if p.nodes_idle and p.up else ""),
        str(p.nodes_mixed),
        str(p.nodes_allocated),
        Text(str(p.nodes_unavailable), style="red" if p.nodes_unavailable else ""),
        Text(f"{p.gpus_free}/{p.gpus_total}", style="bold green" if p.gpus_free and p.up else "")
        if p.gpus_total
        else "-",
        f"{p.cpus_free}/{p.cpus_total}",
    )


def describe(p: Partition) -> str:
    """The selected partition in words: what a job could get there now."""
    gpus = (
        f"GPUs: {p.gpus_free} of {p.gpus_total} free ({', '.join(p.gpu_types) or 'untyped'}; "
        f"{p.gpus_max_per_node} per node at most)"
        if p.gpus_total
        else "no GPUs"
    )
    return (
        f"{p.name}{' (the default partition)' if p.default else ''}: {p.available}, time limit {p.time_limit}\n"
        f"nodes: {p.nodes_idle} idle, {p.nodes_mixed} mixed, {p.nodes_allocated} allocated, "
        f"{p.nodes_unavailable} down or drained ({p.nodes_total} in all)\n"
        f"{gpus} · CPUs: {p.cpus_free} of {p.cpus_total} free"
    )


class ClusterScreen(Screen):
    app: ClusterApp  # for the type checker: Textual types self.app as a plain App

    HELP = (
        "The partitions you can submit to, from one sinfo call per queue refresh. IDLE NODES: "
        "nodes with nothing running, of all the partition's nodes (what a job of whole nodes "
        "can start on now); MIXED: partly allocated; DOWN: down, drained, draining, failing or not "
        "responding. FREE GPUS and FREE CPUS: not allocated, on idle and mixed nodes. * marks the "
        "default partition. p puts the selected partition into the job in Compose."
    )
    BINDINGS = [
        Binding("r", "app.refresh_queue", "Refresh"),
        Binding("p", "use_partition", "Use in Compose"),
        Binding("q", "app.quit", "Quit"),
    ]

    def compose(self) -> ComposeResult:
        yield NavBar("cluster")
        yield DataTable(id="partitions", cursor_type="row", zebra_stripes=True)
        yield Static(id="cluster-detail", markup=False)
        yield StatusLine()
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        self.watch(self.app, "partitions", self._show)
        self.watch(self.app, "cluster_error", self._show)
        self.watch(self.app, "slurm_error", self._show)

    @property
    def selected(self) -> Partition | None:
        table = self.query_one(DataTable)
        found = self.app.partitions or []
        return found[table.cursor_row] if 0 <= table.cursor_row < len(found) else None

    def _show(self, _: object = None) -> None:
        table = self.query_one(DataTable)
        found = self.app.partitions or []
        keep = self.selected.name if self.selected else None
        table.clear()
        for p in found:
            table.add_row(*cells(p), key=p.name)
        names = [p.name for p in found]
        if keep in names:
            table.move_cursor(row=names.index(keep), scroll=False)
        self._show_detail()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    def _show_detail(self) -> None:
        app, detail = self.app, self.query_one("#cluster-detail", Static)
        p = self.selected
        if p is not None:
            detail.update(describe(p))
        elif app.slurm_error:
            detail.update(f"Slurm does not answer, so there is nothing to show: {app.slurm_error}")
        elif app.cluster_error:
            detail.update(f"sinfo failed: {app.cluster_error}")
        elif app.partitions is None:
            detail.update("waiting for the first refresh…")
        else:
            detail.update("sinfo lists no partition you can use")

    async def action_use_partition(self) -> None:
        p = self.selected
        if p is None:
            return
        await self.app.switch_mode("compose")
        screen = self.app.screen
        if isinstance(screen, ComposeScreen):
            screen.query_one("#sections", TabbedContent).active = "tab-slurm"
            screen.query_one(f"#{editor_id('slurm.partition')} Input", Input).value = p.name
            self.app.notify(f"slurm.partition = {p.name}", markup=False)
