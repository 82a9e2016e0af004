"""Consumer group names: the one rule every experience buffer and the loop config take.

A ``file://`` group names files (``groups/.GROUP.offset.PID`` must fit a 255-byte file
name), and librdkafka aborts the whole process on an empty ``group.id``: a name is checked
here, up front, before any buffer's server is asked. Imports nothing heavy (the loop
config uses it).
"""

from __future__ import annotations

import re

from kernel.errors import ConfigError

MAX_GROUP_CHARACTERS = 200
_GROUP_NAME = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_GROUP_CHARACTERS}}}")
GROUP_NAME_RULE = f"1 to {MAX_GROUP_CHARACTERS} letters, digits, '.', '_' or '-'"


def group_name_problem(group: object) -> str | None:
    """What is wrong with ``group`` as a consumer group's name, or None when it is one."""
    if isinstance(group, str) and _GROUP_NAME.fullmatch(group):
        return None
    if not isinstance(group, str):
        given = f"a {type(group).__name__}"
    elif not group:
        given = "empty"
    elif len(group) > MAX_GROUP_CHARACTERS:
        given = f"{group[:20]!r}... ({len(group)} characters)"
    else:
        given = repr(group)
    return f"consumer group {given}: a group name is {GROUP_NAME_RULE}"


def check_group_name(group: str) -> str:
    """``group``, or :class:`ConfigError` saying what a group name may be."""
    problem = group_name_problem(group)
    if problem is not None:
        raise ConfigError(problem)
    return group
