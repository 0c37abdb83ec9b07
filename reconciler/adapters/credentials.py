"""Credentials in URLs: hidden from every message (``redact``), sent only in a header
(``basic_auth``). Shared by the Git, metrics and alert adapters; imports nothing heavy."""

from __future__ import annotations

import base64
import re
import urllib.parse


def redact(text: str) -> str:
    """``text`` with the user:password@ part of any URL in it hidden."""
    return re.sub(r"(?<=://)[^/@\s]+@", "***@", text)


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
