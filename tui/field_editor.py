"""One job.toml key in the compose form: name and type, an editor that fits the type (switch,
choice list, or text input), the key's docstring from the spec schema, and its validation errors.
Listed (the compose screen sets `listed`, ctrl+l), it is a list of values instead: one text input,
`V1, V2, ...` as `clusterfsdp sweep --grid` reads them; the single value stays for going back."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.reactive import var
from textual.widgets import Input, Label, Select, Static, Switch

from .form import FormField, display, list_text


def editor_id(path: str) -> str:
    return "f-" + path.replace(".", "-")


class FieldEditor(Vertical):
    class Changed(Message):
        """The value in the editor changed (typing, toggling, choosing, listing, or loading a file)."""

        def __init__(self, editor: FieldEditor) -> None:
            super().__init__()
            self.editor = editor

    listed = var(False, init=False)
    """A list of values (one sweep point each) instead of one value."""

    def __init__(self, field: FormField, value: Any) -> None:
        super().__init__(id=editor_id(field.path), classes="field")
        self.field = field
        self._initial = value

    def compose(self) -> ComposeResult:
        f = self.field
        yield Label(self._title())
        if f.kind == "bool":
            yield Switch(value=bool(self._initial), classes="value")
        elif f.kind == "choice":
            yield Select(
                self._options(self._initial), value=self._initial, allow_blank=False, compact=True, classes="value"
            )
        else:
            yield Input(
                value=display(f, self._initial),
                placeholder=display(f, f.default) or f.type_label,
                compact=True,
                classes="value",
            )
        # select_on_focus off: what turning the field into a list put there is to be added to, not typed over
        yield Input(placeholder="V1, V2, ...: one run each", compact=True, select_on_focus=False, classes="values")
        yield Static(f.doc, classes="doc", markup=False)
        yield Static("", classes="errors", markup=False)

    def _title(self) -> Content:
        f = self.field
        title = Content.from_markup("[b]$key[/]  [dim]$type[/]", key=f.key or f.section, type=f.type_label)
        return title + Content.from_markup("  [$accent]list of values: one run each[/]") if self.listed else title

    def _options(self, value: Any) -> list[tuple[str, Any]]:
        """The schema's choices, plus a value from an opened file that is not one of them, so it
        shows (with validate's "did you mean") instead of vanishing."""
        options = [(str(c), c) for c in self.field.choices]
        if value not in self.field.choices:
            options.append((f"{value} (invalid)", value))
        return options

    @property
    def raw(self) -> Any:
        """The editor's single value: bool, a choice, or the text typed."""
        if self.field.kind == "bool":
            return self.query_one(Switch).value
        if self.field.kind == "choice":
            return self.query_one(Select).value
        return self.query_one(".value", Input).value

    @property
    def values_text(self) -> str:
        """The list of values as typed."""
        return self.query_one(".values", Input).value

    def set_value(self, value: Any, values_text: str | None = None) -> None:
        """Load a value; with `values_text`, listed with those values."""
        if self.field.kind == "bool":
            self.query_one(Switch).value = bool(value)
        elif self.field.kind == "choice":
            select = self.query_one(Select)
            select.set_options(self._options(value))
            select.value = value
        else:
            self.query_one(".value", Input).value = display(self.field, value)
        self.listed = values_text is not None
        self.query_one(".values", Input).value = values_text or ""

    def watch_listed(self, listed: bool) -> None:
        self.set_class(listed, "-listed")
        values = self.query_one(".values", Input)
        if listed and not values.value:
            values.value = list_text(self.field, self.raw)
        self.query_one(Label).update(self._title())
        self.post_message(self.Changed(self))

    def focus_editor(self) -> None:
        """Focus what is shown: the list of values, or the single value's editor."""
        self.query_one(".values" if self.listed else ".value").focus()

    def set_errors(self, errors: list[str]) -> None:
        self.set_class(bool(errors), "-invalid")
        self.query_one(".errors", Static).update("\n".join(errors))

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.Changed(self))

    def on_switch_changed(self, event: Switch.Changed) -> None:
        event.stop()
        self.post_message(self.Changed(self))

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        self.post_message(self.Changed(self))
