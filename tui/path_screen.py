"""Ask for a job.toml path: type it, or (when opening) pick it from a tree of folders and
.toml files under the current directory."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DirectoryTree, Input

from .toml_tree import TomlTree


class PathScreen(ModalScreen[Path | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, title: str, initial: str, browse: bool) -> None:
        super().__init__(classes="path-screen")
        self.title_text, self.initial, self.browse = title, initial, browse

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog") as box:
            box.border_title = self.title_text
            box.border_subtitle = "enter to accept, esc to cancel"
            yield Input(value=self.initial, placeholder="path/to/job.toml", id="path")
            if self.browse:
                yield TomlTree(".", id="tree")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.dismiss(Path(event.value.strip()).expanduser())

    def on_directory_tree_file_selected(self, event: DirectoryTree.FileSelected) -> None:
        self.dismiss(event.path)
