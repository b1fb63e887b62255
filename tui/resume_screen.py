"""Resume a run from a chosen checkpoint: optionally on a different number of nodes, with
`--set`-style overrides, on a chosen executor. The overrides are checked against the run's
job.toml (the same load and validation the service does) before the dialog closes, so a bad one
is shown under the field with everything typed still there. Returns what to submit; the run
screen submits."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from clusterfsdp.control import launch
from clusterfsdp.core import runfolder
from clusterfsdp.core import spec as specmod

from .actions import requested
from .latest import deliver


@dataclass(frozen=True)
class ResumeRequest:
    step: int
    nodes: str  # as typed
    overrides_text: str  # as typed, so a failed resume can reopen the dialog with it
    overrides: list[str]  # parsed, with slurm.nodes added when the node count changed
    executor: launch.Requested


class ResumeScreen(ModalScreen[ResumeRequest | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(
        self, run: runfolder.RunFolder, step: int, nodes: int, executor: str, typed: ResumeRequest | None = None
    ) -> None:
        super().__init__(classes="resume-screen")
        self.run, self.step, self.nodes, self.executor = run, step, nodes, executor
        self.typed = typed  # what was typed last time for this run (a resume that failed)

    def compose(self) -> ComposeResult:
        typed = self.typed
        with Vertical(classes="dialog") as box:
            box.border_title = f"Resume {self.run.id} from step {self.step}"
            yield Static(
                "A new attempt of this run loads the checkpoint (resharded to the new world size); "
                "newer checkpoints are set aside, not deleted.",
                markup=False,
            )
            yield Label("nodes")
            yield Input(typed.nodes if typed else str(self.nodes), id="nodes", type="integer")
            yield Label("overrides (KEY=VALUE …, as with --set)")
            yield Input(
                typed.overrides_text if typed else "", id="overrides", placeholder="train.steps=300 train.lr=1e-4"
            )
            yield Label("executor")
            yield Select(
                [(e, e) for e in ("auto", "slurm", "local")],
                value=typed.executor if typed else self.executor,
                allow_blank=False,
                id="executor",
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
        text = self.query_one("#overrides", Input).value
        try:
            overrides = shlex.split(text)
        except ValueError as e:
            error.update(f"overrides: {e}")
            return
        if int(nodes) != self.nodes:
            overrides.append(f"slurm.nodes={nodes}")
        executor = requested(self.query_one("#executor", Select).value)
        error.update("checking the overrides…")
        self._check(ResumeRequest(self.step, nodes, text, overrides, executor))

    @work(thread=True, exclusive=True, group="check", exit_on_error=False)
    def _check(self, request: ResumeRequest) -> None:
        """The run's job.toml with the overrides, validated as the resume will: every error at once."""
        try:
            self.run.spec(request.overrides)
        except specmod.SpecError as e:
            deliver(self.app, self._refused, "\n".join(e.errors))
            return
        except OSError as e:
            deliver(self.app, self._refused, f"cannot read {self.run.job_toml}: {e}")
            return
        deliver(self.app, self.dismiss, request)

    def _refused(self, errors: str) -> None:
        self.query_one("#resume-error", Static).update(errors)
        self.query_one("#overrides", Input).focus()
