"""`bubblespec.config`: a field description with a percent sign reaches `--help` as written
(argparse formats help strings with %, so the parser escapes it)."""

from __future__ import annotations

from bubblespec.config import BaseConfig, build_parser


class _Knobs(BaseConfig):
    cut: float = 0.5
    """Cuts 6-16% of the step (100% at most)."""
    on: bool = False
    """Saves 50% when on."""


def test_percent_signs_in_descriptions_survive_help() -> None:
    text = build_parser(_Knobs, prog="knobs").format_help()
    assert "Cuts 6-16% of the step (100% at most)." in text
    assert "Saves 50% when on." in text
