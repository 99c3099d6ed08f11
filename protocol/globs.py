"""Artifact globs (docs/logs.md, Artifacts): the one matching rule the agent (which files it
collects) and the control plane (which names it accepts) share.

A glob is matched against a relative ``/``-separated name, segment by segment: ``*`` matches any
characters within one segment (never ``/``), ``?`` one character, ``[abc]`` / ``[!abc]`` one
character of (not of) the set, and a whole segment ``**`` matches zero or more directories (as
the last segment: everything below). ``*.txt`` matches ``a.txt`` but not ``sub/a.txt``;
``**/*.txt`` matches both. Names starting with ``.`` are matched like any other.
"""

from __future__ import annotations

import re
from functools import lru_cache


def _segment(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = i + 1
            if end < len(text) and text[end] == "!":
                end += 1
            if end < len(text) and text[end] == "]":
                end += 1
            end = text.find("]", end)
            if end < 0:
                out.append(re.escape(char))
            else:
                body = text[i + 1 : end]
                negate = body.startswith("!")
                body = body[1:] if negate else body
                out.append("(?!/)[" + ("^" if negate else "") + body.replace("\\", "\\\\") + "]")
                i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


@lru_cache(maxsize=256)
def compile_glob(glob: str) -> re.Pattern[str]:
    """The regular expression of ``glob`` (see the module docstring), matched with ``fullmatch``."""
    segments = glob.split("/")
    out: list[str] = []
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            out.append(".*" if last else "(?:[^/]*/)*")
        else:
            out.append(_segment(segment) + ("" if last else "/"))
    return re.compile("".join(out), re.DOTALL)


def matches(name: str, glob: str) -> bool:
    """Whether the relative ``/``-separated ``name`` matches ``glob``."""
    return compile_glob(glob).fullmatch(name) is not None


def matches_any(name: str, globs: list[str] | tuple[str, ...]) -> bool:
    """Whether ``name`` matches one of ``globs``."""
    return any(matches(name, glob) for glob in globs)


def has_control_characters(text: str) -> bool:
    """Whether ``text`` holds a control character (C0 incl. NUL, CR, LF, TAB; DEL; C1)."""
    return any(ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0 for char in text)
