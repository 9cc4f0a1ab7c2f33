"""Credentials out of what is logged or reported: the one place a URL's password is hidden."""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?<=://)(?:([^/@\s:]*):)?[^/@\s]+@")


def redacted(text: str) -> str:
    """`text` with the password of every URL in it replaced by `***`
    (`https://user:token@host/` -> `https://user:***@host/`, a bare token `https://token@host`
    -> `https://***@host`): NATS URLs and driver sources travel into logs, errors, failure
    events and the policy's status."""

    def hide(found: re.Match[str]) -> str:
        user = found.group(1)
        return "***@" if user is None else f"{user}:***@"

    return _USERINFO.sub(hide, text)
