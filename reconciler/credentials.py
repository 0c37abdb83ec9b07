"""Credentials in URLs: hidden from every message (``redact``), sent only in a header
(``basic_auth``). Shared by the Git, metrics and alert adapters; imports nothing heavy.

The service also registers the secrets it was given (``conceal``): should one ever reach a
message by a path nobody foresaw, ``redact`` hides it there too.
"""

from __future__ import annotations

import base64
import re
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

_concealed: set[str] = set()
_concealed_lock = threading.Lock()
# Shorter values would hide ordinary words; no real token or secret is this short.
_SHORTEST_CONCEALED = 6


def conceal(*secrets: str | None) -> None:
    """Hide these values from every later ``redact`` in this process."""
    with _concealed_lock:
        _concealed.update(s for s in secrets if s and len(s) >= _SHORTEST_CONCEALED)


def redact(text: str) -> str:
    """``text`` with the user:password@ part of any URL in it and every concealed value hidden."""
    text = re.sub(r"(?<=://)[^/@\s]+@", "***@", text)
    for secret in sorted(_concealed, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def redact_all(value: Any) -> Any:
    """``value`` with credentials hidden in every string inside it (mappings and sequences
    become dicts and lists: what JSON makes of them anyway)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {str(k): redact_all(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [redact_all(v) for v in value]
    return value


def basic_auth(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without its user:password@ part, and the Authorization header that carries it.

    Neither urllib nor the error messages built from a URL should ever see the password.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, {}
    netloc = parts.netloc.rpartition("@")[2]
    user = urllib.parse.unquote(parts.username or "")
    password = urllib.parse.unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), {
        "Authorization": f"Basic {token}"
    }
