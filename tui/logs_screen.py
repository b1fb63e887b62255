"""Logs: one rank's log of one attempt of the selected run, followed as it grows.

All file access happens in workers through `logtail.LogFile`: opening shows the last megabyte
at once, polling reads only new bytes, search and "first error" stream the file and then read
a window around the hit, and scrolling past either end of the window reads the next piece.
With "newest" as the attempt, the view moves to a requeued or resumed attempt's log by itself.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Input, Label, Select, Static
from textual.worker import get_current_worker

from clusterfsdp.control import logs
from clusterfsdp.core import runfolder

from .byte_sizes import human_size
from .latest import deliver
from .log_view import LogView
from .logtail import CHUNK_BYTES, ERRORS, Chunk, LogFile, Search, compile_query
from .nav_bar import NavBar
from .shown_paths import shown
from .status_line import StatusLine

if TYPE_CHECKING:
    from .app import ClusterApp

NEWEST = ""  # the attempt choice that follows requeues and resumes
# Footer groups: one footer item per pair of keys, so every key fits at 80 columns.
SEARCH, MATCH = Binding.Group("Search"), Binding.Group("Match")
ENDS, RANK = Binding.Group("Top/end"), Binding.Group("Rank")
PAGE_BYTES = CHUNK_BYTES // 4


def ranks_of(run: runfolder.RunFolder, attempt: str | None) -> list[int]:
    folder = run.logs_dir / attempt if attempt else None
    found = sorted(int(p.stem[4:]) for p in folder.glob("rank*.log") if p.stem[4:].isdigit()) if folder else []
    return found or [0]


class LogsScreen(Screen):
    app: ClusterApp  # for the type checker: Textual types self.app as a plain App

    HELP = (
        "The selected run's log, one rank and attempt at a time. It opens at the end and follows "
        "new lines (f toggles; scrolling up pauses, End or G resumes). As in less and vim, / searches "
        "down from the current line and ? searches up (smart case: case matters only if the query "
        "has capitals); n repeats the search in its direction, N the other way, and past the end of "
        "the file it goes on from the other end. e jumps to the first error or traceback in the "
        "whole file. Only a window of the file is held in memory; scrolling past its ends reads "
        "more. Attempt 'newest' moves on to a requeued or resumed attempt by itself."
    )
    BINDINGS = [
        Binding("f", "toggle_follow", "Follow"),
        Binding("slash", "search(False)", "Search down", group=SEARCH),
        Binding("question_mark", "search(True)", "Search up", group=SEARCH),
        Binding("n", "next_match(False)", "Next match", group=MATCH),
        Binding("N", "next_match(True)", "Previous match", group=MATCH),
        Binding("e", "first_error", "First error"),
        Binding("g", "top", "Top", group=ENDS),
        Binding("G", "bottom", "End", group=ENDS),
        Binding("left_square_bracket", "rank(-1)", "Previous rank", group=RANK),
        Binding("right_square_bracket", "rank(1)", "Next rank", group=RANK),
        Binding("q", "app.quit", "Quit", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.run: runfolder.RunFolder | None = None
        self.attempt = NEWEST
        self.rank = 0
        self.file: LogFile | None = None
        self.at_tail = False  # the window reaches the end of the file: polling appends to it
        self.query_text = ""
        self.search: Search | None = None  # what n and N look for: the last / or ? query, or errors after e
        self.search_up = False  # the last search's direction: ? (up) or / and e (down)
        self._polling = False
        self._typing_up = False  # the direction of the search being typed
        self._pollers: list[Timer] = []
        self._attempt_options: list[str] = [NEWEST]
        self._rank_options: list[int] = [0]

    def compose(self) -> ComposeResult:
        yield NavBar("logs")
        with Horizontal(id="log-bar"):
            yield Label("attempt")
            yield Select([("newest", NEWEST)], value=NEWEST, allow_blank=False, id="attempt")
            yield Label("rank")
            yield Select([("0", 0)], value=0, allow_blank=False, id="rank")
            yield Static(id="log-info", markup=False)
        yield LogView(id="log")
        yield Input(placeholder="search down (enter: the next match; esc: cancel)", id="search")
        yield StatusLine()
        yield Footer(show_command_palette=False)

    @property
    def view(self) -> LogView:
        return self.query_one(LogView)

    def on_mount(self) -> None:
        self._pollers = [self.set_interval(0.5, self._poll), self.set_interval(2.0, self._discover)]
        self.watch(self.app, "current_key", self._run_changed)
        self.watch(self.view, "follow", self._follow_changed, init=False)

    def on_screen_suspend(self) -> None:
        for timer in self._pollers:
            timer.pause()

    def on_screen_resume(self) -> None:
        for timer in self._pollers:
            timer.resume()
        self._run_changed()
        self.view.focus()

    # ---- which file
    def _run_changed(self, _: object = None) -> None:
        run = self.app.current_run
        if run == self.run and (run is not None or self.file is None):
            return
        self.run, self.attempt, self.rank, self.file, self.at_tail = run, NEWEST, 0, None, False
        row = self.app.current_row
        if run is None:
            self.view.message(
                f"Slurm job {row.job_id} was not submitted by clusterfsdp: it has no run folder; "
                "its output is wherever its sbatch --output points."
                if row
                else "No run selected: pick one in the Queue (2)."
            )
        else:
            self.view.message(f"looking for the logs of {run.id}…")
        self._discover()

    @work(thread=True, exclusive=True, group="discover", exit_on_error=False)
    def _discover(self) -> None:
        run, attempt, rank = self.run, self.attempt, self.rank
        if run is None:
            return
        keys = logs.attempt_keys(run)
        ranks = ranks_of(run, attempt or (keys[-1] if keys else None))
        path = logs.log_file(run, rank, attempt or None)
        deliver(self.app, self._discovered, run, keys, ranks, path)

    def _discovered(self, run: runfolder.RunFolder, keys: list[str], ranks: list[int], path: Path | None) -> None:
        if run != self.run:
            return
        if [NEWEST, *reversed(keys)] != self._attempt_options:
            self._attempt_options = [NEWEST, *reversed(keys)]
            select = self.query_one("#attempt", Select)
            with select.prevent(Select.Changed):
                select.set_options([("newest", NEWEST)] + [(k, k) for k in reversed(keys)])
                select.value = self.attempt if self.attempt in self._attempt_options else NEWEST
        if ranks != self._rank_options:
            self._rank_options = ranks
            select = self.query_one("#rank", Select)
            with select.prevent(Select.Changed):
                select.set_options([(str(r), r) for r in ranks])
                select.value = self.rank if self.rank in ranks else ranks[0]
        if path is None:
            if self.file is None:
                self.view.message(f"No log yet for rank {self.rank} of {run.id} (pending, or not started).")
            return
        if self.file is None or self.file.path != path:
            self._open(path)

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "attempt":
            self.attempt = str(event.value)
        else:
            self.rank = int(str(event.value))
        self.file = None
        self._discover()

    def action_rank(self, step: int) -> None:
        ranks = self._rank_options
        self.query_one("#rank", Select).value = (
            ranks[(ranks.index(self.rank) + step) % len(ranks)] if self.rank in ranks else ranks[0]
        )

    # ---- reading
    @work(thread=True, exclusive=True, group="read", exit_on_error=False)
    def _open(self, path: Path) -> None:
        """Show the end of `path` and follow it."""
        file = LogFile(path)
        chunk = file.tail()
        deliver(self.app, self._show, file, chunk, None, True)

    def _show(self, file: LogFile, chunk: Chunk, at: int | None, at_tail: bool) -> None:
        self.file, self.at_tail = file, at_tail
        if at is None:
            self.view.follow = True
        self.view.load(chunk, at)
        self._show_info()

    def _show_info(self) -> None:
        if self.file is None:
            return
        size = self.file.end if self.at_tail else max(self.file.end, self.view.end)
        mode = "following" if self.view.follow and self.at_tail else "paused (G: end and follow)"
        path = self.file.path
        name = path.relative_to(self.run.path) if self.run and path.is_relative_to(self.run.path) else shown(path)
        self.query_one("#log-info", Static).update(f"{name} · {human_size(size)} · {mode}")

    def _poll(self) -> None:
        if self.file is not None and self.at_tail and not self._polling:
            self._polling = True
            self._read_new(self.file)

    @work(thread=True, group="poll", exit_on_error=False)
    def _read_new(self, file: LogFile) -> None:
        try:
            chunk = file.read_new()
        finally:
            self.app.call_from_thread(setattr, self, "_polling", False)
        self.app.call_from_thread(self._polled, file, chunk)

    def _polled(self, file: LogFile, chunk: Chunk) -> None:
        if file is not self.file:
            return
        if chunk.reset:  # rewritten, or more arrived than is worth reading: start again at the end
            if self.view.follow:
                self._open(file.path)
            else:
                self.at_tail = False
            return
        if chunk.lines:
            self.view.append(chunk)
            self._show_info()

    def on_log_view_edge(self, event: LogView.Edge) -> None:
        if self.file is not None and not (event.where == "after" and self.at_tail):
            self._page(self.file, event.where, self.view.start if event.where == "before" else self.view.end)

    @work(thread=True, exclusive=True, group="page", exit_on_error=False)
    def _page(self, file: LogFile, where: str, offset: int) -> None:
        if where == "before":
            chunk = file.before(offset, PAGE_BYTES)
        else:
            chunk = file.after(offset, PAGE_BYTES)
        deliver(self.app, self._paged, file, where, offset, chunk, file.size())

    def _paged(self, file: LogFile, where: str, offset: int, chunk: Chunk, size: int) -> None:
        if file is not self.file or offset != (self.view.start if where == "before" else self.view.end):
            return  # the window changed meanwhile
        if where == "before":
            self.view.prepend(chunk)
        else:
            self.view.append(chunk)
            if chunk.partial or chunk.end >= size:
                self.at_tail, file.end = True, chunk.end
        self._show_info()

    def _follow_changed(self, follow: bool) -> None:
        if follow and not self.at_tail and self.file is not None:
            self._open(self.file.path)
        self._show_info()

    def action_toggle_follow(self) -> None:
        self.view.follow = not self.view.follow
        if self.view.follow:
            self.view.scroll_end(animate=False)

    def action_bottom(self) -> None:
        self.view.action_scroll_end()

    def action_top(self) -> None:
        if self.file is not None:
            self.view.follow = False
            self._jump(self.file, None, False, 0)

    # ---- search
    def action_search(self, up: bool) -> None:
        box = self.query_one("#search", Input)
        box.add_class("-open")
        box.placeholder = f"search {'up' if up else 'down'} (enter: the next match; esc: cancel)"
        box.value = self.query_text
        box.focus()
        self._typing_up = up

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._close_search()
        if event.value:
            self.query_text = event.value
            self.search = compile_query(event.value)
            self.search_up = self._typing_up
            self.view.highlight = self.search.text
            self.action_next_match(False, inclusive=True)

    def key_escape(self) -> None:
        if self.query_one("#search", Input).has_class("-open"):
            self._close_search()

    def _close_search(self) -> None:
        self.query_one("#search", Input).remove_class("-open")
        self.view.focus()

    def action_next_match(self, reverse: bool, inclusive: bool = False) -> None:
        """The nearest match in the last search's direction (the other way if `reverse`): in the
        window, else in the file, else from the file's other end (vim's wrapscan)."""
        view, search = self.view, self.search
        if search is None or view.highlight is None or self.file is None:
            self.app.notify("/ or ? to search first")
            return
        backward = self.search_up != reverse
        if view.current is None:  # from the bottom (or top) of what is on screen
            top = round(view.scroll_y)
            start = min(len(view.lines) - 1, top + view.size.height - 1) if backward else top
        else:
            start = view.current if inclusive else view.current + (-1 if backward else 1)
        view.follow = False
        found = view.find(view.highlight, start, backward)
        if found is not None:
            view.show_line(found)
        else:
            self._jump(self.file, search, backward, view.start if backward else view.end)

    def action_first_error(self) -> None:
        if self.file is None:
            return
        self.search, self.search_up = ERRORS, False
        self.view.highlight = ERRORS.text
        self.view.follow = False
        self._jump(self.file, ERRORS, False, 0, wrap=False)

    @work(thread=True, exclusive=True, group="search", exit_on_error=False)
    def _jump(self, file: LogFile, search: Search | None, backward: bool, start: int, wrap: bool = True) -> None:
        """Find `search` in the file from byte `start` (None: go to `start`) and show a window
        there; with `wrap`, a search that reaches an end of the file goes on from the other end."""
        self.app.call_from_thread(setattr, self.app, "activity", "searching the log…")
        worker = get_current_worker()
        wrapped = False
        if search is None:
            offset: int | None = start
        else:
            offset = self._find(file, search, backward, start, lambda: worker.is_cancelled)
            if offset is None and wrap and not worker.is_cancelled:
                wrapped = True
                offset = self._find(file, search, backward, file.size() if backward else 0, lambda: worker.is_cancelled)
        chunk = file.around(offset) if offset is not None else None
        size = file.size()
        deliver(self.app, self._jumped, file, offset, chunk, size, wrapped, backward)

    @staticmethod
    def _find(file: LogFile, search: Search, backward: bool, start: int, cancelled: Callable[[], bool]) -> int | None:
        if backward:
            return file.search_backward(search, start, cancelled)
        return file.search_forward(search, start, cancelled)

    def _jumped(
        self, file: LogFile, offset: int | None, chunk: Chunk | None, size: int, wrapped: bool, backward: bool
    ) -> None:
        self.app.activity = ""
        if file is not self.file:
            return
        if offset is None or chunk is None:
            self.app.notify("no match in the file", severity="warning")
            return
        if wrapped:  # as vim says it
            self.app.notify(f"search hit {'TOP, continuing at BOTTOM' if backward else 'BOTTOM, continuing at TOP'}")
        at_tail = chunk.partial or chunk.end >= size
        if at_tail:
            file.end = chunk.end
        self._show(file, chunk, offset, at_tail)
