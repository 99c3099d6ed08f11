"""Artifact globs (protocol/globs.py, docs/logs.md Artifacts): ``*`` never crosses ``/``,
``**`` does; the agent collects and the control plane accepts by this one rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.artifacts import collect
from logs.rules import matches_declared
from protocol.globs import has_control_characters, matches


@pytest.mark.parametrize(
    "name, glob, expected",
    [
        ("a.txt", "*.txt", True),
        ("sub/dir/deep.txt", "*.txt", False),
        ("sub/a.txt", "sub/*.txt", True),
        ("sub/dir/a.txt", "sub/*.txt", False),
        ("a.txt", "**/*.txt", True),
        ("sub/dir/deep.txt", "**/*.txt", True),
        ("out/x/y/z.bin", "out/**", True),
        ("other/z.bin", "out/**", False),
        ("a/b.txt", "a/**/b.txt", True),
        ("a/x/y/b.txt", "a/**/b.txt", True),
        ("ab/c.txt", "a?c.txt", False),
        ("abc.txt", "a?c.txt", True),
        ("a1.log", "a[0-9].log", True),
        ("a/.log", "a[!x].log", False),
        ("ax.log", "a[!x].log", False),
        ("ay.log", "a[!x].log", True),
        ("report.json", "report.json", True),
        ("reportXjson", "report.json", False),
        (".hidden", "*", True),
    ],
)
def test_star_stays_within_a_segment_and_double_star_crosses(name, glob, expected):
    assert matches(name, glob) is expected
    assert matches_declared(name, [glob]) is expected  # the control plane's check is the same rule


def test_control_characters_are_found():
    assert all(has_control_characters(f"a{c}b") for c in "\r\n\x00\t\x7f\x85")
    assert not has_control_characters("ünïcode name.txt")


def test_the_agent_collects_by_the_same_rule(tmp_path: Path):
    for name in ("top.txt", "sub/dir/deep.txt", "sub/mid.txt", "bad\nname.txt", "x.bin"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / "link.txt").symlink_to(tmp_path / "top.txt")
    limits = {"maxFiles": 16, "maxFileBytes": 100, "maxTotalBytes": 1000, "retentionDays": 1, "secretEnv": []}

    def names(*paths: str) -> list[str]:
        found, _ = collect(tmp_path, {**limits, "paths": list(paths)})  # type: ignore[typeddict-item]
        return [item.name for item in found]

    assert names("*.txt") == ["top.txt"]
    assert names("**/*.txt") == ["sub/dir/deep.txt", "sub/mid.txt", "top.txt"]
    assert names("sub/*.txt") == ["sub/mid.txt"]
