"""Version numbers, the same everywhere: in request paths, pushes and directory names.

A version is written as a plain ASCII decimal integer from 1 to 2**63 - 1, without sign,
spaces or leading zeros: "3", never "+3", " 3", "03", "³" or "٣". Anything else is not a
version: a request naming it gets 404 or 422, a directory so named is skipped (and said so).
"""

from __future__ import annotations

from kernel.errors import NotFound, quoted

MAX_VERSION = 2**63 - 1  # what a signed 64-bit integer holds (JSON readers, Prometheus)
DESCRIPTION = f"an integer from 1 to {MAX_VERSION}, written with ASCII digits only"


def parse_version(text: str) -> int | None:
    """The version ``text`` names, or None when it is not a version number."""
    if not (text.isascii() and text.isdigit()) or text.startswith("0") or len(text) > 19:
        return None
    number = int(text)
    return number if number <= MAX_VERSION else None


def path_version(text: str) -> int:
    """The version a request path names; NotFound when it names none."""
    version = parse_version(text)
    if version is None:
        raise NotFound(f"version {quoted(text)}: a version is {DESCRIPTION}")
    return version
