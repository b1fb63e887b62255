"""Resume a run from a chosen checkpoint: optionally on a different number of nodes, with
`--set`-style overrides, on a chosen executor. Returns what to submit; the run screen submits."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static


@dataclass(frozen=True)
class ResumeRequest:
    step: int
    overrides: list[str]
    executor: str


class ResumeScreen(ModalScreen[ResumeRequest | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, run_id: str, step: int, nodes: int, executor: str) -> None:
        super().__init__(classes="resume-screen")
        self.run_id, self.step, self.nodes, self.executor = run_id, step, nodes, executor

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog") as box:
            box.border_title = f"Resume {self.run_id} from step {self.step}"
            yield Static(
                "A new attempt of this run loads the checkpoint (resharded to the new world size); "
                "newer checkpoints are set aside, not deleted.",
                markup=False,
            )
            yield Label("nodes")
            yield Input(str(self.nodes), id="nodes", type="integer")
            yield Label("overrides (KEY=VALUE …, as with --set)")
            yield Input("", id="overrides", placeholder="train.steps=300 train.lr=1e-4")
            yield Label("executor")
            yield Select(
                [(e, e) for e in ("auto", "slurm", "local")], value=self.executor, allow_blank=False, id="executor"
            )
            yield Static("", id="resume-error", classes="errors", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Resume", variant="primary", id="resume")
                yield Button("Cancel", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel":
            self.dismiss(None)
        else:
            self._accept()

    def on_input_submitted(self) -> None:
        self._accept()

    def _accept(self) -> None:
        error = self.query_one("#resume-error", Static)
        nodes = self.query_one("#nodes", Input).value.strip()
        if not nodes.isdigit() or int(nodes) < 1:
            error.update("nodes: a whole number of at least 1")
            return
        try:
            overrides = shlex.split(self.query_one("#overrides", Input).value)
        except ValueError as e:
            error.update(f"overrides: {e}")
            return
        if int(nodes) != self.nodes:
            overrides.append(f"slurm.nodes={nodes}")
        self.dismiss(ResumeRequest(self.step, overrides, str(self.query_one("#executor", Select).value)))
