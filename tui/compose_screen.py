"""Compose: a form over the whole job.toml schema, one tab per section, every key with its
docstring. Each change is validated (in a worker) with validate's own messages, shown under
the field and listed under Problems; Summary and sbatch show what would be submitted. Any field
can be a list of values (ctrl+l): the job is then a sweep, checked point by point and submitted
as `clusterfsdp sweep` does (tui/actions.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Button, Footer, Label, OptionList, Select, Static, TabbedContent, TabPane
from textual.widgets.option_list import Option

from clusterfsdp.control import launch, sweepplan
from clusterfsdp.control.partitions import Partition
from clusterfsdp.core import fileio
from clusterfsdp.core import spec as specmod
from clusterfsdp.core.errors import describe

from . import actions, form
from .confirm_screen import ConfirmScreen
from .data_screen import DataScreen
from .field_editor import FieldEditor, editor_id
from .job_summary import Summary, summarize
from .latest import deliver
from .nav_bar import NavBar
from .path_screen import PathScreen
from .shown_paths import shown
from .status_line import StatusLine

if TYPE_CHECKING:
    from .app import ClusterApp


class ComposeScreen(Screen):
    app: ClusterApp  # for the type checker: Textual types self.app as a plain App

    HELP = (
        "Edit a job: one tab per section of job.toml, each key with its help text. Errors are the "
        "ones `clusterfsdp validate` prints, shown under the field and under Problems (select one to "
        "jump to it). Numbers and times are typed as in TOML; lists and tables as TOML literals, e.g. "
        '["a.txt"] or { KEY = "value" }. Relative paths are relative to the job file\'s folder '
        "(the current directory until it is saved). Save writes the keys the file had plus every "
        "key that differs from its default. Esc leaves a field, so 1-6 switch screens. "
        "ctrl+l turns the field you are in into a list of values, e.g. 1e-4, 3e-4 (and back): the "
        "job is then a sweep, one run per point (the cross product of the lists), checked point by "
        "point as `clusterfsdp sweep` checks it; saved, the lists are the file's [sweep] grid. "
        "ctrl+t shows the samples the saved job trains on, the trained tokens marked."
    )
    BINDINGS = [
        Binding("ctrl+s", "save", "Save"),
        Binding("ctrl+o", "open", "Open"),
        Binding("ctrl+n", "new", "New"),
        Binding("ctrl+g", "submit", "Submit"),
        Binding("ctrl+l", "toggle_list", "List/value"),
        Binding("ctrl+t", "data", "Data"),
        Binding("escape", "leave_field", "Leave field", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.path: Path | None = None  # the file edited; None: new, or a copy of a run's job
        self.origin = "new job"
        self.present: set[str] = set()  # keys the opened file had (saving keeps them)
        self.sweep_rest: dict[str, Any] = {}  # the opened file's [sweep] table but the lists in fields
        self.list_order: list[str] = []  # the fields that are lists, in the order of the [sweep] grid
        self.saved_text: str | None = None
        self.review: form.Review | None = None
        self.summary: Summary | None = None
        self._review_queued = False
        self._file_problems: list[str] = []

    def compose(self) -> ComposeResult:
        yield NavBar("compose")
        with Horizontal(id="compose-body"):
            with TabbedContent(id="sections"):
                for section in form.SECTIONS:
                    # can_focus=False: tab goes from the section's tabs straight to its first field,
                    # never to the scroll container (no focus to see, and typing went nowhere)
                    with TabPane(section, id=f"tab-{section}"), VerticalScroll(can_focus=False):
                        for f in form.FIELDS:
                            if f.section == section:
                                yield FieldEditor(f, f.default)
            with Vertical(id="compose-side"):
                yield Static(id="compose-file")
                with TabbedContent(id="side"):
                    with TabPane("Summary", id="summary-tab"):
                        yield Static(id="summary", markup=False)
                    with TabPane("Problems", id="problems-tab"):
                        yield OptionList(id="problems")
                    with TabPane("sbatch", id="sbatch-tab"), VerticalScroll(id="sbatch-scroll"):
                        yield Static(id="sbatch", markup=False)
                with Horizontal(id="compose-actions"):
                    yield Label("executor")
                    yield Select(
                        [(e, e) for e in ("auto", "local", "slurm")],
                        value="auto",
                        allow_blank=False,
                        compact=True,
                        id="executor",
                    )
                    yield Button("Save", id="save", compact=True)
                    yield Button("Submit", variant="primary", id="submit", compact=True)
        yield StatusLine()
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self.watch(self.app, "slurm_available", self._queue_review)
        self.watch(self.app, "partitions", self._queue_review, init=False)

    # ---- validation as you type
    def on_field_editor_changed(self, event: FieldEditor.Changed) -> None:
        self._queue_review()

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "executor":
            self._queue_review()

    def _queue_review(self, _: object = None) -> None:
        """One review per batch of changes (opening a file changes every field at once)."""
        if not self._review_queued:
            self._review_queued = True
            self.call_after_refresh(self._start_review)

    def _start_review(self) -> None:
        self._review_queued = False
        editors = {e.field.path: e for e in self.query(FieldEditor)}
        raw = {path: e.raw for path, e in editors.items()}
        lists = {path: editors[path].values_text for path in self.list_order}
        executor = str(self.query_one("#executor", Select).value)
        present = frozenset(self.present)  # what saving keeps: the review checks what would be saved
        self._review(raw, lists, present, self._base(), executor, self.app.slurm_available, self.app.partitions)

    def _base(self) -> Path:
        return (self.path.parent if self.path else Path.cwd()).absolute()

    @work(thread=True, exclusive=True, group="review", exit_on_error=False)
    def _review(
        self,
        raw: dict[str, Any],
        lists: dict[str, str],
        present: frozenset[str],
        base: Path,
        executor: str,
        slurm_available: bool | None,
        partitions: list[Partition] | None,
    ) -> None:
        review = form.review_job(raw, lists, self.sweep_rest, base, present)
        summary = None
        if review.spec is not None:
            summary = summarize(review.spec, base, executor, slurm_available, partitions, review.sweep)
        deliver(self.app, self._show_review, review, summary)

    def _show_review(self, review: form.Review, summary: Summary | None) -> None:
        self.review, self.summary = review, summary
        counts: dict[str, int] = {}
        for editor in self.query(FieldEditor):
            errors = review.for_field(editor.field.path)
            editor.set_errors(errors)
            counts[editor.field.section] = counts.get(editor.field.section, 0) + len(errors)
        sections = self.query_one("#sections", TabbedContent)
        for section, n in counts.items():
            sections.get_tab(f"tab-{section}").label = Content(f"{section} ✗{n}" if n else section)
        problems = self.query_one("#problems", OptionList)
        listed = self._file_problems + review.errors
        if [str(problems.get_option_at_index(i).prompt) for i in range(problems.option_count)] != listed:
            # only when they changed: a review after a queue refresh must not move the highlight
            problems.clear_options()
            problems.add_options([Option(e, id=form.field_of(e)) for e in listed])
            problems.highlighted = 0 if problems.option_count else None
        side = self.query_one("#side", TabbedContent)
        total = len(review.errors) + len(self._file_problems)
        side.get_tab("problems-tab").label = Content(f"Problems ({total})" if total else "Problems")
        self.query_one("#summary", Static).update(
            summary.text if summary else f"{len(review.errors)} problem(s): see Problems"
        )
        self.query_one("#sbatch", Static).update(summary.sbatch if summary else "")
        self._show_file()

    def _show_file(self) -> None:
        text = self._text()
        modified = self.path is None or text != self.saved_text
        where = shown(self.path) if self.path else self.origin
        self.query_one("#compose-file", Static).update(
            Content.from_markup(
                "[b]$where[/] $state",
                where=where,
                state="(modified)" if modified and self.path else "(not saved)" if modified else "",
            )
        )

    def _text(self) -> str | None:
        if self.review is None or self.review.errors:
            return None
        return form.dumps(form.to_data(self.review.values, keep=self.present, sweep=self.review.table))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        """A problem picked: show its field."""
        path = event.option.id
        if path is None:
            return
        editor = self.query_one(f"#{editor_id(path)}", FieldEditor)
        self.query_one("#sections", TabbedContent).active = f"tab-{editor.field.section}"
        editor.focus_editor()
        editor.scroll_visible()

    def action_leave_field(self) -> None:
        self.set_focus(None)

    def action_toggle_list(self) -> None:
        """The focused field becomes a list of values (a sweep), or one value again."""
        editor = next((a for a in self.focused.ancestors if isinstance(a, FieldEditor)), None) if self.focused else None
        if editor is None:
            self.app.notify("ctrl+l acts on the field you are in: tab to one first", severity="warning")
            return
        if (why := sweepplan.fixed_reason(editor.field.path)) is not None:
            self.app.notify(f"{editor.field.path}: {why}", severity="warning")
            return
        editor.listed = not editor.listed
        path = editor.field.path
        self.list_order = [p for p in self.list_order if p != path] + ([path] if editor.listed else [])
        self.call_after_refresh(editor.focus_editor)  # once the other editor shows

    # ---- open, new, save
    def action_new(self) -> None:
        self._load(form.new_job(), None, "new job", None)

    def action_open(self) -> None:
        def chosen(path: Path | None) -> None:
            if path is not None:
                self.open_file(path)

        self.app.push_screen(PathScreen("Open job.toml", str(self.path or ""), browse=True), chosen)

    @work(thread=True, group="file", exit_on_error=False)
    def open_file(self, path: Path, template: bool = False) -> None:
        """Load a job.toml into the form; `template`: a run's resolved job, edited as a new file."""
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            self.app.call_from_thread(self.app.notify, f"cannot read {path}: {e}", severity="error")
            return
        opened = form.from_toml(text)
        if template:
            origin = f"copy of run {path.parent.name} (save it as a new file)"
            self.app.call_from_thread(self._load, opened, None, origin, None)
        else:
            self.app.call_from_thread(self._load, opened, path, str(path), text)

    def _load(self, opened: form.Opened, path: Path | None, origin: str, text: str | None) -> None:
        self.path, self.origin, self.present, self._file_problems = path, origin, opened.present, opened.problems
        self.sweep_rest, self.list_order = opened.sweep, list(opened.lists)
        for editor in self.query(FieldEditor):
            editor.set_value(opened.values[editor.field.path], opened.lists.get(editor.field.path))
        table, _ = form.sweep_table(opened.lists, opened.sweep)
        self.saved_text = form.dumps(form.to_data(opened.values, opened.present, table)) if text is not None else None
        for problem in opened.problems:
            self.app.notify(problem, title="opened with problems", severity="warning")
        self._queue_review()

    def action_save(self) -> None:
        if self.review is None or self.review.errors:
            n = len(self.review.errors) if self.review else 0
            self.app.notify(f"fix {n} problem(s) first (see Problems)", severity="error")
            return
        if self.path is None:

            def chosen(path: Path | None) -> None:
                if path is not None:
                    self._save(path)

            self.app.push_screen(PathScreen("Save job.toml as", "job.toml", browse=False), chosen)
        else:
            self._save(self.path)

    def _save(self, path: Path) -> None:
        assert self.review is not None
        present = self.present | {f.path for f in form.FIELDS if self.review.values[f.path] != f.default}
        text = form.dumps(form.to_data(self.review.values, keep=present, sweep=self.review.table))
        self._write(path, text, present)

    @work(thread=True, group="file", exit_on_error=False)
    def _write(self, path: Path, text: str, present: set[str], create: bool = False) -> None:
        """Write the file (temp file + rename); a missing folder is created only once asked."""
        folder = path.parent
        if not folder.is_dir() and not create:
            if folder.exists():
                message = f"cannot write {path}: {folder} is not a folder"
                self.app.call_from_thread(self.app.notify, message, severity="error")
            else:
                self.app.call_from_thread(self._ask_create, path, text, present)
            return
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fileio.atomic_write(path, text)
        except OSError as e:
            self.app.call_from_thread(self.app.notify, f"cannot write {path}: {e}", severity="error")
            return
        self.app.call_from_thread(self._saved, path, text, present)

    def _ask_create(self, path: Path, text: str, present: set[str]) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self._write(path, text, present, create=True)
            else:
                self.app.notify(f"not saved: {shown(path.parent)} does not exist", severity="warning")

        question = f"The folder {shown(path.parent)} does not exist.\nCreate it and save {path.name} there?"
        self.app.push_screen(ConfirmScreen("Save job.toml", question, yes="Create and save"), answered)

    def _saved(self, path: Path, text: str, present: set[str]) -> None:
        self.path, self.origin, self.present, self.saved_text = path, str(path), present, text
        self.app.notify(f"saved {shown(path)}")
        self._queue_review()  # relative paths now resolve against the file's folder

    # ---- submit
    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        elif event.button.id == "submit":
            self.action_submit()

    def action_data(self) -> None:
        """The saved job's training samples (DataScreen): its data paths are relative to the file."""
        text = self._text()
        if self.path is None or text is None or text != self.saved_text:
            self.app.notify("save the job first (ctrl+s): the data shown is the saved file's", severity="warning")
            return
        sources = self.review.spec.data.sources if self.review is not None and self.review.spec else []
        self.app.push_screen(DataScreen(self.path.absolute(), len(sources)))

    def action_submit(self) -> None:
        if self.summary is None or self.review is None or self.review.errors:
            self.app.notify("fix the problems first (see Problems)", severity="error")
            return
        self.app.activity = "checking Slurm…"
        self._check_executor(self.summary, str(self.query_one("#executor", Select).value), self._base())

    @work(thread=True, group="submit", exit_on_error=False)
    def _check_executor(self, shown_summary: Summary, executor: str, base: Path) -> None:
        """Ask Slurm again before asking the user: the summary's executor was decided when the
        controller was last probed (perhaps at start-up); the dialog shows, and the submit uses,
        what holds now ("auto" is resolved here, so what is confirmed is what runs)."""
        available = self.app.slurm.available()
        summary = summarize(shown_summary.spec, base, executor, available, self.app.partitions, shown_summary.sweep)
        chosen = actions.requested(executor if executor != "auto" else "slurm" if available else "local")
        self.app.call_from_thread(self._confirm_submit, shown_summary, summary, chosen, available)

    def _confirm_submit(
        self, shown_summary: Summary, summary: Summary, chosen: launch.Requested, available: bool
    ) -> None:
        self.app.activity = ""
        self.app.slurm_available = available  # the summary on screen follows
        question = summary.text
        if summary.text != shown_summary.text:
            question = f"Slurm's answer changed since the summary was made; submitting now means:\n\n{question}"

        def answered(yes: bool | None) -> None:
            if yes:
                self.app.activity = f"submitting {summary.spec.job.name}…"
                self._submit(summary, chosen)

        self.app.push_screen(ConfirmScreen("Submit", question, yes="Submit"), answered)

    @work(thread=True, group="submit", exit_on_error=False)
    def _submit(self, summary: Summary, executor: launch.Requested) -> None:
        """A run, or a sweep of the job's points when fields are lists of values."""
        try:
            if summary.sweep is not None:
                sweep, notice = actions.sweep(summary.sweep.job, executor)
                text = f"sweep {sweep.id}: {len(summary.sweep.points)} points ({notice})"
                self.app.call_from_thread(self._submitted, text, sweep=sweep.path)
            else:
                sub = actions.submit(summary.spec, executor)
                text = f"run {sub.run.id}: job {sub.job_id} ({sub.notice})"
                self.app.call_from_thread(self._submitted, text, run=sub.run.path)
        except Exception as e:
            self.app.call_from_thread(self._refused, e)

    async def _submitted(self, text: str, run: Path | None = None, sweep: Path | None = None) -> None:
        """Show what was submitted: the run in the Queue, or the sweep in Sweeps."""
        self.app.activity = ""
        self.app.notify(text)
        if sweep is not None:
            self.app.current_sweep = str(sweep)
        else:
            self.app.current_key = str(run)
        self.app.refresh_queue(now=True)
        await self.app.switch_mode("queue" if sweep is None else "sweeps")

    def _refused(self, error: Exception) -> None:
        """A refused job's problems (a sweep's name the point) join the form's, until it changes."""
        self.app.activity = ""
        self.app.notify(f"submit failed: {describe(error)}", severity="error", timeout=10)
        if isinstance(error, (specmod.SpecError, sweepplan.SweepError)) and self.review is not None:
            self._show_review(replace(self.review, errors=self.review.errors + error.lines), self.summary)
