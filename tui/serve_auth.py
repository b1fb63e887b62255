"""Who may drive `clusterfsdp tui --serve`: a token, the Host header and the Origin header.

textual-serve has no authentication: whoever reaches the port gets a session that submits,
cancels and saves files as you. On a shared login node every user can connect to 127.0.0.1,
and any web page open in the browser behind `ssh -L` can try a WebSocket to it (cross-site,
or through DNS rebinding). So, as Jupyter does, every request (page, WebSocket, static files,
downloads) must pass three checks, else 403:

- the Host header names the loopback (127.0.0.1, localhost, [::1]; any port, since
  `ssh -L 9000:127.0.0.1:8000` changes it) or a reverse proxy given with --allow-origin: a
  DNS name rebound to 127.0.0.1 is refused;
- an Origin header, when one is sent (browsers always send it on a WebSocket), is the origin of
  the request's own Host or one given with --allow-origin: a foreign page is refused even with a
  good token (a page on another port of 127.0.0.1 is the same *site*, so SameSite alone would
  let its WebSocket carry the cookie);
- the token: `?token=` (the first page load, or a script) or the cookie that the first good page
  load sets (HttpOnly, SameSite=Strict, Path=/) while redirecting to the same URL without the
  token, so it leaves the address bar and the history. Compared with hmac.compare_digest. The
  cookie is not the token but a session value derived from it and the server's port (HMAC):
  cookies ignore ports, so the browser sends it to every server on 127.0.0.1, and a server on
  another port (another user's, or one given the same token) can neither use it nor learn the
  token from it.

The token is printed only to a terminal; it is always written to `token_file(port)` (mode 0600,
in $XDG_RUNTIME_DIR/clusterfsdp or the user config folder), whose path is printed instead: a
server started with its output in a log file (umask 022: readable by all) does not leak it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

TOKEN_ENV = "CLUSTERFSDP_TUI_TOKEN"
MIN_TOKEN_CHARS = 16
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})
_HOST = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9._-]+)(?::[0-9]{1,5})?")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_GOOGLE_FONTS = re.compile(r"<link\b[^>]*\bhref=\"https://fonts\.googleapis\.com/[^>]*>")
# The family textual.js asks the terminal for, from textual-serve's own static/fonts.
_FONT_FILES = {"normal": "RobotoMono-VariableFont_wght.ttf", "italic": "RobotoMono-Italic-VariableFont_wght.ttf"}
_FONT_FACE = '@font-face{{font-family:"Roboto Mono";font-style:{};font-weight:100 700;src:url("/static/fonts/{}")}}'
FONT_FACES = "<style>" + "".join(_FONT_FACE.format(style, name) for style, name in _FONT_FILES.items()) + "</style>"


class AccessConfigError(ValueError):
    """A bad token or --allow-origin: one line, `<key>: <what>`."""


def take_token(environ: MutableMapping[str, str]) -> str:
    """$CLUSTERFSDP_TUI_TOKEN if set (for scripts; an environment is private to its user, a
    command line is not), else a fresh random one. The variable is removed from `environ`, so
    the app sessions (and the jobs they submit) never inherit it."""
    given = environ.pop(TOKEN_ENV, None)
    if given is None:
        return secrets.token_urlsafe(32)
    if len(given) < MIN_TOKEN_CHARS or not given.isascii() or not given.isprintable():
        raise AccessConfigError(f"{TOKEN_ENV}: needs at least {MIN_TOKEN_CHARS} printable ASCII characters")
    return given


def normalise_origin(origin: str) -> str:
    """`scheme://host[:port]` in lower case without a default port; AccessConfigError otherwise."""
    parts = urlsplit(origin.strip().lower())
    only_origin = parts.path in ("", "/") and not (parts.query or parts.fragment or parts.username or parts.password)
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or not only_origin:
        raise AccessConfigError(f"--allow-origin: {origin!r} is not an origin like https://tui.example.org[:port]")
    netloc = parts.netloc
    if parts.port == _DEFAULT_PORTS[parts.scheme]:
        netloc = netloc.rsplit(":", 1)[0]
    return f"{parts.scheme}://{netloc}"


@dataclass(frozen=True)
class Access:
    """The token and the origins a served TUI accepts."""

    token: str
    extra_origins: tuple[str, ...] = ()  # normalised; from --allow-origin (reverse proxies)
    port: int = 0  # the server's own port (not the browser's, which a tunnel may change)

    @property
    def session_value(self) -> str:
        """The cookie's value: only this server (its token and its port) accepts it."""
        return hmac.new(self.token.encode(), f"clusterfsdp-tui-session:{self.port}".encode(), "sha256").hexdigest()

    @property
    def cookie_name(self) -> str:
        """Named after a digest of the session value: cookies ignore ports, so two servers behind
        two tunnels on one laptop would otherwise overwrite each other's cookie."""
        return "clusterfsdp-tui-" + hashlib.sha256(self.session_value.encode()).hexdigest()[:12]

    def host_ok(self, host: str) -> bool:
        """The Host header names the loopback (any port) or an --allow-origin host."""
        host = host.lower()
        match = _HOST.fullmatch(host)
        if match is None:
            return False
        return match.group(1) in LOOPBACK_NAMES or any(o.split("://", 1)[1] == host for o in self.extra_origins)

    def page_origin(self, host: str) -> str:
        """The origin the browser sees for a request with this (checked) Host header."""
        host = host.lower()
        return next((o for o in self.extra_origins if o.split("://", 1)[1] == host), f"http://{host}")

    def origin_ok(self, origin: str, host: str) -> bool:
        return origin.lower() in (self.page_origin(host), *self.extra_origins)

    def token_ok(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode(), self.token.encode())

    def cookie_ok(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode(), self.session_value.encode())


def refusal(request: web.Request, access: Access) -> str | None:
    """Why this request is refused, or None when it may go on."""
    host = request.headers.get(hdrs.HOST, "")
    if not access.host_ok(host):
        return f"Host {host!r} is not this server's"
    origin = request.headers.get(hdrs.ORIGIN)
    if origin is not None and not access.origin_ok(origin, host):
        return f"Origin {origin!r} may not use this server"
    if not (access.token_ok(request.query.get("token")) or access.cookie_ok(request.cookies.get(access.cookie_name))):
        return "missing or wrong token: open the URL that `clusterfsdp tui --serve` printed (…/?token=…)"
    return None


def guard(access: Access) -> Middleware:
    """aiohttp middleware: refuses with 403 what `refusal` refuses; a good `?token=` on the page
    becomes a cookie and a redirect to the same URL without it."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        reason = refusal(request, access)
        if reason is not None:
            raise web.HTTPForbidden(text=f"403 Forbidden: {reason}\n")
        if request.path == "/" and "token" in request.query:
            response = web.HTTPFound(request.rel_url.without_query_params("token"))
            response.set_cookie(access.cookie_name, access.session_value, path="/", httponly=True, samesite="Strict")
            raise response
        return await handler(request)

    return check


def offline_page(access: Access, public_url: str) -> Middleware:
    """aiohttp middleware for the page itself: textual-serve's template loads the Roboto Mono
    font from Google Fonts (a login node, or a laptop offline, has no such access: the terminal
    then draws in a fallback font) and writes absolute URLs to `public_url`, which break when
    the browser reaches the server as localhost or through a tunnel on another port. Both are
    rewritten: the font comes from textual-serve's own static/fonts, URLs from the Host used."""

    @web.middleware
    async def rewrite(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        if request.path != "/" or not isinstance(response, web.Response) or response.content_type != "text/html":
            return response
        html = _GOOGLE_FONTS.sub(lambda _link: FONT_FACES, response.text or "", count=1)
        response.text = rebase(html, public_url, access.page_origin(request.headers[hdrs.HOST]))
        return response

    return rewrite


def rebase(html: str, public_url: str, origin: str) -> str:
    """Absolute URLs to `public_url` (http and ws) made to point at `origin` instead."""
    ws_public = "ws" + public_url.removeprefix("http")
    ws_origin = "ws" + origin.removeprefix("http")
    return html.replace(ws_public + "/", ws_origin + "/").replace(public_url + "/", origin + "/")


def from_environment(allow_origins: list[str], port: int) -> Access:
    """The Access for this process: token from the environment (removed there) or random."""
    return Access(take_token(os.environ), tuple(normalise_origin(o) for o in allow_origins), port)


def token_file(port: int) -> Path:
    """Where the token of the server on `port` is kept: $XDG_RUNTIME_DIR/clusterfsdp (private to
    the user and gone at logout), else the user config folder's clusterfsdp/."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    base = Path(runtime) if runtime and Path(runtime).is_dir() else None
    if base is None:
        base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "clusterfsdp" / f"tui-{port}.token"


def write_token_file(access: Access) -> Path:
    """The token in token_file(port), mode 0600, in a folder that only you can write (made 0700);
    AccessConfigError if it belongs to someone else or others may write it."""
    path = token_file(access.port)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.parent.stat()
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o022:
        raise AccessConfigError(f"token file: {path.parent} must be yours and writable by you only")
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(access.token + "\n")
    os.replace(tmp, path)
    return path


def remove_token_file(access: Access) -> None:
    """At shutdown: the file, unless another server on the same port replaced it since."""
    path = token_file(access.port)
    try:
        if path.read_text().strip() == access.token:
            path.unlink()
    except OSError:
        pass
