"""Who may use the live view: its page's own requests, and with an access token only
those who hold it.

Two guards, as ASGI middleware around the view's Starlette app (:mod:`ackstream.ui.view`):

- :class:`SameOrigin` guards every state-changing request (any method but GET and
  HEAD, e.g. ``POST /api/replay``): it must come from the page itself. Its ``Origin``
  (or, absent, its ``Referer``) must name the host it was sent to, its content type
  must be ``application/json`` (a cross-site form can send neither without the
  browser asking the server first, which nothing here answers), and it must carry the
  page token in the :data:`TOKEN_HEADER` header. The page token is random per server
  start and written into the page (``<meta name="ackstream-token">``): another site's
  script cannot read it. Anything else is answered 403 with a one-line JSON error.
  Served on loopback with no access token, every request must also name a loopback
  host (``Host: 127.0.0.1:PORT``, ``localhost``): a site whose name was made to
  resolve to this machine (DNS rebinding) would otherwise be the page's own origin.
- :class:`AccessToken` guards every request with a token the operator chose (``ackstream
  ui --access-token``), required when the view listens beyond loopback: a request
  carries it as ``Authorization: Bearer TOKEN`` (a Prometheus scrape) or in the
  :data:`COOKIE` cookie, which a first visit to ``/?token=TOKEN`` sets. Others get 401.
"""

from __future__ import annotations

import ipaddress
import secrets
from urllib.parse import urlsplit

from starlette.datastructures import Headers, QueryParams
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "COOKIE",
    "TOKEN_HEADER",
    "AccessToken",
    "SameOrigin",
    "is_loopback",
    "new_page_token",
]

#: The header the page sends its token in, on every state-changing request.
TOKEN_HEADER = "x-ackstream-token"
#: The cookie that holds the operator's access token once ``?token=`` was given.
COOKIE = "ackstream_access"
_SAFE_METHODS = frozenset({"GET", "HEAD"})


def new_page_token() -> str:
    """A fresh page token: random, unguessable, one per server start."""
    return secrets.token_urlsafe(32)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) answers only this machine.

    >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("localhost")
    (True, True, True)
    >>> is_loopback("0.0.0.0"), is_loopback("example.com")
    (False, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return False


def _refuse(status: int, error: str) -> JSONResponse:
    return JSONResponse({"error": error}, status_code=status)


class SameOrigin:
    """Refuse a state-changing request that is not the page's own (see the module doc)."""

    def __init__(self, app: ASGIApp, page_token: str, loopback_only: bool = True):
        self.app, self.page_token, self.loopback_only = app, page_token, loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            host = urlsplit("//" + headers.get("host", "")).hostname or ""
            error = None
            if self.loopback_only and not is_loopback(host):
                error = (
                    f"refused: Host {host!r} is not a loopback name; open the view at "
                    "http://127.0.0.1:PORT/ (or serve it with --access-token)"
                )
            elif scope["method"] not in _SAFE_METHODS:
                error = self.refused(headers)
            if error is not None:
                await _refuse(403, error)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refused(self, headers: Headers) -> str | None:
        """Why a request with these headers is refused, or None if it is the page's."""
        sent_from = headers.get("origin") or headers.get("referer")
        if not sent_from or sent_from == "null":
            return "refused: a state-changing request needs an Origin or Referer header"
        if urlsplit(sent_from).netloc.lower() != headers.get("host", "").lower():
            return f"refused: a request from {sent_from} is cross-site; use the view's own page"
        content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if content_type != "application/json":
            return "refused: a state-changing request must have Content-Type application/json"
        if not secrets.compare_digest(headers.get(TOKEN_HEADER, ""), self.page_token):
            return f"refused: missing or wrong {TOKEN_HEADER} header; reload the view's page"
        return None


class AccessToken:
    """Refuse every request without the operator's access token (see the module doc);
    ``?token=TOKEN`` on a GET sets the :data:`COOKIE` cookie for the next ones."""

    def __init__(self, app: ASGIApp, token: str):
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        bearer = headers.get("authorization", "")
        given = bearer[len("Bearer ") :] if bearer.startswith("Bearer ") else ""
        cookies = dict(
            part.strip().split("=", 1)
            for part in headers.get("cookie", "").split(";")
            if "=" in part
        )
        query = QueryParams(scope.get("query_string", b"").decode("latin-1")).get("token", "")
        if self._holds(given) or self._holds(cookies.get(COOKIE, "")):
            await self.app(scope, receive, send)
        elif scope["method"] in _SAFE_METHODS and self._holds(query):
            await self.app(scope, receive, self._setting_cookie(send))
        else:
            await _refuse(
                401,
                "refused: this view needs its access token: open /?token=TOKEN once, or send "
                "Authorization: Bearer TOKEN",
            )(scope, receive, send)

    def _holds(self, given: str) -> bool:
        return bool(given) and secrets.compare_digest(given, self.token)

    def _setting_cookie(self, send: Send) -> Send:
        cookie = f"{COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message["headers"], (b"set-cookie", cookie.encode())]
            await send(message)

        return sending
