"""`clusterfsdp tui --serve` with real servers: plain HTTP and WebSocket clients (aiohttp) check
who is refused (no or wrong token, a foreign Host or Origin), and headless Chromium (Debian's
package, over the DevTools protocol) opens the printed URL, reads what the app sent, drives it
with a key press, and records every request the page made: none may leave the server. A
screenshot is kept under tmp_path. The token is printed only to a terminal and kept in a 0600
file, the cookie is bound to the server's port, and a port in use is one line."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import pty
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from procs import free_port
from tui_helpers import make_run

from clusterfsdp.tui.serve_auth import (
    TOKEN_ENV,
    Access,
    AccessConfigError,
    normalise_origin,
    rebase,
    take_token,
    token_file,
)

RUN_ID = "20260101-120000-aaaa"
SERVE = [sys.executable, "-m", "clusterfsdp.cli", "tui", "--serve"]
_ANSI = re.compile(rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[()][A-Z0-9]|\x1b[=>78]")


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


def _listeners(port: int) -> list[str]:
    """Local addresses of the LISTEN sockets on `port`, from /proc/net/tcp and tcp6."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if int(hex_port, 16) == port and state == "0A":
                found.append(socket.inet_ntoa(struct.pack("<I", int(address, 16))) if len(address) == 8 else address)
    return found


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass(frozen=True)
class Served:
    port: int
    url: str  # what to open: http://127.0.0.1:PORT/?token=... (the token from the printed file)
    token: str
    runs: Path
    token_file: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def serving(tmp_path: Path, *extra: str, token: str | None = None) -> Iterator[Served]:
    """`clusterfsdp tui --serve` on a free port over one run folder; `token` goes in through
    $CLUSTERFSDP_TUI_TOKEN, else the server makes one and writes it to the file it prints
    (its output is a file, not a terminal: the token is not printed)."""
    runs = tmp_path / "runs"
    make_run(runs, RUN_ID)
    port = free_port()
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV} | {"XDG_RUNTIME_DIR": str(runtime)}
    if token is not None:
        env[TOKEN_ENV] = token
    printed = tmp_path / "serve.out"
    with printed.open("wb") as out:
        proc = subprocess.Popen(
            [*SERVE, "--port", str(port), "--run-root", str(runs), "--refresh", "3600", *extra],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_port(port, proc)
        found = re.search(
            r"serving on (\S+)/\?token=<the token in that file>\n  token file: (\S+) ", printed.read_text()
        )
        assert found is not None, printed.read_text()
        path = Path(found.group(2))
        assert path == runtime / "clusterfsdp" / f"tui-{port}.token" and path.stat().st_mode & 0o777 == 0o600
        token = path.read_text().strip()
        yield Served(port, f"{found.group(1)}/?token={token}", token, runs, path)
    finally:
        _stop(proc)


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[int]:
    """Headless Chromium with the DevTools protocol on a free port; yields that port."""
    profile = tmp_path / "chromium-profile"
    proc = subprocess.Popen(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--remote-debugging-port=0",
            "--remote-debugging-address=127.0.0.1",
            f"--user-data-dir={profile}",
            "--window-size=1280,800",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (active.is_file() and active.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "chromium did not start"
            time.sleep(0.1)
        yield int(active.read_text().split()[0])
    finally:
        _stop(proc)


class Page:
    """One browser tab over CDP: commands, the terminal bytes the page received, and the URL of
    every request the page made (documents, scripts, styles, fonts, images, WebSockets)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.next_id = ws, 0
        self.terminal = b""
        self.requests: list[str] = []

    async def call(self, method: str, **params: Any) -> dict:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            message = json.loads((await self.ws.receive(timeout=60)).data)
            self._event(message)
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return message["result"]

    def _event(self, message: dict) -> None:
        if message.get("method") == "Network.requestWillBeSent":
            self.requests.append(message["params"]["request"]["url"])
        elif message.get("method") == "Network.webSocketCreated":
            self.requests.append(message["params"]["url"])
        elif message.get("method") == "Network.webSocketFrameReceived":
            response = message["params"]["response"]
            if response["opcode"] == 2:  # binary: the app's terminal output
                self.terminal += base64.b64decode(response["payloadData"])

    def text(self) -> str:
        return _ANSI.sub(b"", self.terminal).decode("utf-8", "replace")

    async def until_text(self, needle: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            assert time.monotonic() < deadline, f"{needle!r} never reached the page; got:\n{self.text()[-2000:]}"
            try:
                self._event(json.loads((await self.ws.receive(timeout=1)).data))
            except TimeoutError:
                pass


def png_colours(png: bytes) -> int:
    """How many distinct colours an 8-bit RGB(A) PNG holds (1 for a blank page)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos : pos + 8])
        body = png[pos + 8 : pos + 8 + length]
        header, idat = (body, idat) if kind == b"IHDR" else (header, idat + body if kind == b"IDAT" else idat)
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6)
    bpp, raw = (3 if colour == 2 else 4), zlib.decompress(idat)
    stride, prev, seen = width * bpp, bytearray(width * bpp), set()
    for y in range(height):
        kind, row = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):  # PNG's five scanline filters
            a, b = row[i - bpp] if i >= bpp else 0, prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                row[i] = (row[i] + a) & 255
            elif kind == 2:
                row[i] = (row[i] + b) & 255
            elif kind == 3:
                row[i] = (row[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        seen.update(bytes(row[x : x + bpp]) for x in range(0, stride, bpp * 7))  # every 7th pixel is plenty
        prev = row
    return len(seen)


def test_serve_in_chromium_token_url_renders_offline_and_drives_the_app(chromium, tmp_path):
    """The printed URL works in a browser: the token becomes an HttpOnly cookie and leaves the
    address bar, the page, its scripts, the font and the WebSocket all come from the server
    (nothing goes to a CDN: a login node is offline), and the app answers a key press."""
    with serving(tmp_path) as served:
        assert _listeners(served.port) == ["127.0.0.1"]
        with socket.socket() as s:  # another loopback address: nothing there
            assert s.connect_ex(("127.0.0.2", served.port)) != 0
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[A-Za-z0-9_-]{43}", served.url)  # token_urlsafe(32)
        asyncio.run(_browse(served, chromium, tmp_path))


async def _browse(served: Served, devtools_port: int, tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{devtools_port}/json/list") as r:
            tab = next(t for t in await r.json() if t["type"] == "page")
        async with http.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            page = Page(ws)
            await page.call("Network.enable")
            await page.call("Page.enable")
            await page.call("Page.navigate", url=served.url)
            await page.until_text("2 Queue")
            await page.until_text(RUN_ID)  # the run folder's row in the queue table
            await page.until_text("COMPLETED")

            async def js(expression: str) -> Any:
                result = await page.call("Runtime.evaluate", expression=expression, awaitPromise=True)
                return result["result"].get("value")

            assert await js("location.href") == served.base + "/"  # redirected: the token left the URL
            assert await js("document.cookie") == ""  # HttpOnly: scripts cannot read it
            # the terminal's font family, from the server's static files
            assert await js("""document.fonts.load('16px "Roboto Mono"').then(f => f.length)""") == 1
            # the browser drives the app: a key typed into the terminal (? opens the help)
            await js("document.querySelector('.xterm-helper-textarea').focus()")
            await page.call("Input.insertText", text="?")
            await page.until_text("Help: Queue")
            assert await js("document.body.classList.contains('-first-byte')") is True  # intro hidden
            deadline = time.monotonic() + 30  # the terminal draws on the next animation frames
            while True:
                shot = base64.b64decode((await page.call("Page.captureScreenshot", format="png"))["data"])
                (tmp_path / "tui-serve.png").write_bytes(shot)
                if png_colours(shot) > 5:  # text, table highlight and dialog, not a blank page
                    break
                assert time.monotonic() < deadline, "the page stayed blank"
                await asyncio.sleep(0.2)
    ours = (served.base + "/", f"ws://127.0.0.1:{served.port}/")
    assert [u for u in page.requests if not u.startswith(ours)] == [], page.requests
    assert served.url in page.requests and served.base + "/" in page.requests  # the token URL, then its redirect
    assert served.base + "/static/fonts/RobotoMono-VariableFont_wght.ttf" in page.requests
    assert f"ws://127.0.0.1:{served.port}/ws" in {u.split("?")[0] for u in page.requests}


def _app_sessions(runs: Path) -> list[int]:
    """Pids of the app processes textual-serve started for WebSocket sessions over `runs`."""
    wanted = b"clusterfsdp.tui\0--run-root\0" + str(runs).encode() + b"\0"
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and wanted in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def test_serve_refuses_without_token_foreign_host_or_origin(tmp_path):
    """Real HTTP and WebSocket requests against a server given its token in the environment
    and a reverse proxy's origin: every route wants the token, a rebound Host and a foreign
    Origin are refused even with it, and a good WebSocket gets a live session whose app process
    does not inherit the token."""
    token = "t0ken-from-the-environment-" + "x" * 16
    with serving(tmp_path, "--allow-origin", "https://TUI.example.org:443", token=token) as served:
        assert served.token == token
        asyncio.run(_probe(served))
        printed = (tmp_path / "serve.out").read_text()  # aiohttp's access log would add `GET /?token=...`
        assert token not in printed and "GET" not in printed, printed  # not a terminal: only the file has it
    assert not served.token_file.exists()  # removed when the server stops


async def _probe(served: Served) -> None:
    base, token = served.base, served.token
    access = Access(token, port=served.port)
    cookie_name = access.cookie_name
    own = {"Cookie": f"{cookie_name}={access.session_value}"}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:

        async def status(path: str, **headers: str) -> int:
            async with http.get(base + path, headers=headers, allow_redirects=False) as r:
                return r.status

        async def ws_status(query: str = "", **headers: str) -> int:
            try:
                async with http.ws_connect(f"{base}/ws{query}", headers=headers):
                    return 101
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status

        # no token, a wrong one, or a wrong cookie: every route, the WebSocket included
        for path in ("/", "/ws", "/static/js/textual.js", "/static/", "/download/x", "/nothing"):
            assert await status(path) == 403, path
        assert await status("/?token=" + token[:-1] + "y") == 403
        assert await status("/", Cookie=f"{cookie_name}={access.session_value}y") == 403
        assert await status("/", Cookie=f"{cookie_name}={token}") == 403  # the raw token is no cookie
        other_port = Access(token, port=served.port + 1)  # what a server on another port would set
        assert await status("/", Cookie=f"{cookie_name}={other_port.session_value}") == 403
        assert await status("/", Cookie=f"{other_port.cookie_name}={other_port.session_value}") == 403
        assert await ws_status() == 403
        assert await ws_status("?token=nope") == 403
        # a good token with a Host that is not this machine's (DNS rebinding) or a foreign Origin
        assert await status("/?token=" + token, Host=f"rebind.example.com:{served.port}") == 403
        assert await status("/", Host="127.0.0.1.evil.example", **own) == 403
        for origin in ("http://evil.example", f"http://127.0.0.1:{served.port + 1}", "null", "https://tui.example"):
            assert await ws_status(**own, Origin=origin) == 403, origin
            assert await ws_status("?token=" + token, Origin=origin) == 403, origin

        # the printed URL: a cookie for the page's WebSocket and reloads, and a redirect without the token
        async with http.get(f"{base}/?token={token}&fontsize=14", allow_redirects=False) as r:
            assert r.status == 302 and r.headers["Location"] == "/?fontsize=14"
            cookie = r.cookies[cookie_name]
            assert cookie.value == access.session_value != token and token not in cookie.value
            assert cookie["path"] == "/" and cookie["httponly"] is True
            assert cookie["samesite"] == "Strict"
        for host in (f"127.0.0.1:{served.port}", "localhost:9000", "[::1]:8000"):  # any tunnel port
            async with http.get(base + "/", headers={**own, "Host": host}) as r:
                page = await r.text()
                assert r.status == 200, host
            assert "googleapis" not in page and 'src:url("/static/fonts/RobotoMono' in page
            assert f'data-session-websocket-url="ws://{host}/ws"' in page  # where the browser is
        assert await status("/static/js/textual.js", **own) == 200
        # the reverse proxy's origin: its Host, its scheme in the page's URLs, its Origin on the WebSocket
        async with http.get(base + "/", headers={**own, "Host": "tui.example.org"}) as r:
            assert r.status == 200 and 'data-session-websocket-url="wss://tui.example.org/ws"' in await r.text()
        assert await ws_status(**own, Host="tui.example.org", Origin="http://tui.example.org") == 403
        assert not _app_sessions(served.runs)  # no refused request started an app

        # a good WebSocket: the page's own origin and the cookie give a live session
        origin = f"http://127.0.0.1:{served.port}"
        async with http.ws_connect(f"{base}/ws?width=100&height=30", headers={**own, "Origin": origin}) as ws:
            screen = b""
            while b"Queue" not in _ANSI.sub(b"", screen):
                message = await ws.receive(timeout=60)
                assert message.type == aiohttp.WSMsgType.BINARY, message
                screen += message.data
            # the session's app, and any child it is forking at that moment (a subprocess keeps
            # the app's command line until it execs): none has the token
            pids = _app_sessions(served.runs)
            assert pids
            for pid in pids:
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                    environ = Path(f"/proc/{pid}/environ").read_bytes()
                    assert TOKEN_ENV.encode() not in environ and token.encode() not in environ, pid
        assert await ws_status(**own, Host="tui.example.org", Origin="https://tui.example.org") == 101


def test_serve_refuses_a_weak_token_or_a_bad_origin(tmp_path):
    """Bad settings stop the server before it listens, with one `error: <key>: ...` line."""
    bad = (((), "short", TOKEN_ENV), (("--allow-origin", "tui.example.org"), None, "--allow-origin"))
    for extra, token, key in bad:
        env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV} | ({TOKEN_ENV: token} if token else {})
        proc = _serve_once([*SERVE, "--port", str(free_port()), *extra], tmp_path, env)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
        assert proc.stderr.startswith(f"error: {key}: ") and proc.stderr.count("\n") == 1, proc.stderr


def _serve_once(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`clusterfsdp tui --serve` expected to refuse and exit at once (a bad flag, a port in use)."""
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_access_rules():
    access = Access("a" * 43, (normalise_origin("HTTPS://Tui.Example.org:443/"),))
    assert access.extra_origins == ("https://tui.example.org",)
    for good in ("127.0.0.1:8000", "LOCALHOST:1", "[::1]:8000", "localhost", "tui.example.org"):
        assert access.host_ok(good), good
    for bad in ("", "evil.example:8000", "127.0.0.1.nip.io:80", "localhost.:80", "tui.example.org:8443", "u@localhost"):
        assert not access.host_ok(bad), bad
    assert access.origin_ok("http://localhost:9000", "localhost:9000")
    assert not access.origin_ok("http://localhost:9001", "localhost:9000")
    assert access.origin_ok("https://tui.example.org", "tui.example.org")
    assert not access.origin_ok("http://tui.example.org", "tui.example.org")
    assert access.token_ok("a" * 43) and not access.token_ok("a" * 42) and not access.token_ok(None)
    assert Access("b" * 43).cookie_name != access.cookie_name
    on_8000, on_8001 = Access("a" * 43, port=8000), Access("a" * 43, port=8001)
    assert on_8000.cookie_ok(on_8000.session_value) and not on_8000.cookie_ok(on_8001.session_value)
    assert not on_8000.cookie_ok("a" * 43) and on_8000.cookie_name != on_8001.cookie_name
    for bad in ("tui.example.org", "ftp://x", "https://x/path", "https://u@x", "https://x?q=1"):
        with pytest.raises(AccessConfigError, match=r"^--allow-origin: "):
            normalise_origin(bad)
    environ = {TOKEN_ENV: "k" * 16, "OTHER": "1"}
    assert take_token(environ) == "k" * 16 and environ == {"OTHER": "1"}  # removed for the app sessions
    assert take_token(environ) != take_token(environ)  # random when not given
    html = '<a href="http://127.0.0.1:8000/static/x"></a><div data-u="ws://127.0.0.1:8000/ws"></div>'
    assert rebase(html, "http://127.0.0.1:8000", "https://t.org") == (
        '<a href="https://t.org/static/x"></a><div data-u="wss://t.org/ws"></div>'
    )


def test_serve_on_a_terminal_prints_the_token_url_and_the_file(tmp_path):
    """On a terminal (a person starting it) the URL to open is printed whole, and the file too."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV} | {"XDG_RUNTIME_DIR": str(runtime)}
    leader, follower = pty.openpty()
    argv = [*SERVE, "--port", str(port), "--run-root", str(tmp_path / "runs")]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=follower, stderr=follower, start_new_session=True)
    os.close(follower)
    try:
        out = b""
        while b"Ctrl+C" not in out:
            chunk = os.read(leader, 4096)
            assert chunk, out
            out += chunk
        path = runtime / "clusterfsdp" / f"tui-{port}.token"
        text = out.decode()
        assert f"serving on http://127.0.0.1:{port}/?token={path.read_text().strip()}" in text, text
        assert f"token file: {path} (mode 0600)" in text, text
    finally:
        _stop(proc)
        os.close(leader)


def test_serve_on_a_port_in_use_says_so_in_one_line(tmp_path):
    """Reproduced: a traceback after the URL was printed. Now one line, nothing printed before."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV} | {"XDG_RUNTIME_DIR": str(runtime)}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _serve_once([*SERVE, "--port", str(port), "--run-root", str(tmp_path / "runs")], tmp_path, env)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr == f"error: --port {port}: 127.0.0.1:{port} is in use; choose another --port\n", proc.stderr
    assert not (runtime / "clusterfsdp" / f"tui-{port}.token").exists()


def test_the_token_file_lives_in_the_runtime_folder_else_the_config_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert token_file(8000) == tmp_path / "config" / "clusterfsdp" / "tui-8000.token"  # no such runtime folder
    (tmp_path / "run").mkdir()
    assert token_file(8000) == tmp_path / "run" / "clusterfsdp" / "tui-8000.token"
