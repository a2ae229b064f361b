"""Where a request to an OpenAI-compatible server goes: base URLs, the routing header, its key.

Routers in front of several ``vllm serve`` instances pick a backend by a key the client
sends: vLLM's router (``vllm-router --policy consistent_hash``) reads ``X-Session-ID`` first.
The node gives every request about one camera the same key (:func:`session_key`), so that
camera's goals, follow-up questions and speculative prefills reach the one server whose
prefix and multimodal caches already hold its image; different cameras spread over the
servers. The checks here are the one copy used by the parameter table and the engine.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import urlsplit

DEFAULT_SESSION_HEADER = "X-Session-ID"
MAX_SESSION_KEY_CHARS = 200
MAX_FALLBACK_URLS = 8
URL_RULE = "http(s)://host[:port][/path]/v1, no user:password@, query or fragment"
HEADER_RULE = "empty (no routing header) or an HTTP header name (letters, digits, - _ .)"
SESSION_KEY_RULE = (f"empty (the node's namespace/name) or up to {MAX_SESSION_KEY_CHARS} "
                    "visible ASCII characters, no spaces")

_HEADER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_VISIBLE_ASCII = re.compile(r"^[\x21-\x7e]*$")
# Headers the engine sets itself: a routing header of the same name would clobber them.
_OWN_HEADERS = frozenset({"authorization", "content-type", "content-length", "host", "accept",
                          "x-request-id"})


def base_url_problem(url: str) -> str | None:
    """Return what is wrong with a server's base URL, or None if it can be used.

    The path must end in ``/v1`` (the SDK appends ``/chat/completions``; ``/health`` is
    asked at the URL without ``/v1``). Credentials inside the URL are refused: URLs appear
    in logs and diagnostics, keys never may.
    """
    if not isinstance(url, str) or not url or not _VISIBLE_ASCII.match(url):
        return f"allowed: {URL_RULE}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as e:
        return f"not a URL ({e}); allowed: {URL_RULE}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"allowed: {URL_RULE}"
    if parts.username is not None or parts.password is not None:
        return ("holds credentials (user:password@); give the API key through "
                "engine.api_key_env instead")
    if parts.query or parts.fragment:
        return f"has a query or fragment; allowed: {URL_RULE}"
    if not parts.path.rstrip("/").endswith("/v1"):
        return f"path {parts.path or '/'!r} does not end in /v1; allowed: {URL_RULE}"
    return None


def fallback_urls_problem(urls: Sequence[str]) -> str | None:
    """Return what is wrong with an ordered list of fallback base URLs, or None."""
    if len(urls) > MAX_FALLBACK_URLS:
        return f"{len(urls)} URLs; allowed at most {MAX_FALLBACK_URLS}"
    for i, url in enumerate(urls):
        problem = base_url_problem(url)
        if problem:
            return f"[{i}]={url!r}: {problem}"
        if normalized_url(url) in [normalized_url(u) for u in urls[:i]]:
            return f"[{i}]={url!r} is listed twice"
    return None


def normalized_url(url: str) -> str:
    """Return a base URL without its trailing slashes (``.../v1/`` and ``.../v1`` are one)."""
    return url.rstrip("/")


def header_name_problem(name: str) -> str | None:
    """Return what is wrong with a routing header name, or None ("" sends no header)."""
    if name == "":
        return None
    if not isinstance(name, str) or not _HEADER_NAME.match(name):
        return f"allowed: {HEADER_RULE}"
    if name.lower() in _OWN_HEADERS:
        return f"the engine sets {name} itself; allowed: {HEADER_RULE}"
    return None


def session_key_problem(key: str) -> str | None:
    """Return what is wrong with a session key (or its prefix), or None ("" is allowed)."""
    if not isinstance(key, str) or len(key) > MAX_SESSION_KEY_CHARS \
            or not _VISIBLE_ASCII.match(key):
        return f"allowed: {SESSION_KEY_RULE}"
    return None


def session_key(prefix: str, camera: str) -> str:
    """Return the routing key of requests about ``camera``: ``<prefix>/<camera>``.

    ``prefix`` is ``engine.session_key``, else the node's fully qualified name
    (``/<namespace>/<node>``), so that robots with distinct namespaces never share a key.
    """
    key = f"{prefix.rstrip('/')}/{camera}" if prefix else camera
    return key[-MAX_SESSION_KEY_CHARS:]
