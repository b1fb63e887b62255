"""`clusterfsdp tui --serve` in a real browser: textual-serve bound to 127.0.0.1 only, loaded
in headless Chromium (Debian's package) over the DevTools protocol. The test reads what the
app sent to the page, drives it with a key press, and keeps a screenshot under tmp_path."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from procs import free_port
from tui_helpers import make_run

RUN_ID = "20260101-120000-aaaa"
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


@pytest.fixture
def server(tmp_path: Path) -> Iterator[int]:
    make_run(tmp_path / "runs", RUN_ID)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "clusterfsdp.cli",
            "tui",
            "--serve",
            "--port",
            str(port),
            "--run-root",
            str(tmp_path / "runs"),
            "--refresh",
            "3600",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_port(port, proc)
        yield port
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
    """One browser tab over CDP: commands, and the terminal bytes the page received."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.next_id = ws, 0
        self.terminal = b""

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
        if message.get("method") == "Network.webSocketFrameReceived":
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


def test_serve_binds_localhost_only_and_renders_the_queue_in_chromium(server, chromium, tmp_path):
    assert _listeners(server) == ["127.0.0.1"]
    with socket.socket() as s:  # another loopback address: nothing there
        assert s.connect_ex(("127.0.0.2", server)) != 0

    async def browse() -> None:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{chromium}/json/list") as r:
                tab = next(t for t in await r.json() if t["type"] == "page")
            async with http.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.call("Network.enable")
                await page.call("Page.enable")
                await page.call("Page.navigate", url=f"http://127.0.0.1:{server}/")
                await page.until_text("2 Queue")
                await page.until_text(RUN_ID)  # the run folder's row in the queue table
                await page.until_text("COMPLETED")
                # the browser drives the app: a key typed into the terminal (? opens the help)
                await page.call(
                    "Runtime.evaluate", expression="document.querySelector('.xterm-helper-textarea').focus()"
                )
                await page.call("Input.insertText", text="?")
                await page.until_text("Help: Queue")
                shown = await page.call(
                    "Runtime.evaluate", expression="document.body.classList.contains('-first-byte')"
                )
                assert shown["result"]["value"] is True  # the page hid its intro and shows the terminal
                deadline = time.monotonic() + 30  # the terminal draws on the next animation frames
                while True:
                    shot = base64.b64decode((await page.call("Page.captureScreenshot", format="png"))["data"])
                    (tmp_path / "tui-serve.png").write_bytes(shot)
                    if png_colours(shot) > 5:  # text, table highlight and dialog, not a blank page
                        break
                    assert time.monotonic() < deadline, "the page stayed blank"
                    await asyncio.sleep(0.2)

    asyncio.run(browse())
