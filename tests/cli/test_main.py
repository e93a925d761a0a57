"""The `bubblespec` dispatcher: every subcommand (and every benchmark) answers `--help` with
its usage and exit status 0; an unknown command is refused with the command list."""

from __future__ import annotations

import pytest

from bubblespec.cli.main import COMMANDS, main

BENCHES = ("service", "engine", "suffix", "draft-batch", "per-request", "sync", "soak",
           "workload-stats", "policy")


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse exits after printing the help
        rc = int(e.code or 0)
    assert rc == 0, argv
    return capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert "usage" in _help([command, "--help"], capsys).lower()


@pytest.mark.parametrize("bench", BENCHES)
def test_every_benchmark_has_help(bench: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert f"bubblespec bench {bench}" in _help(["bench", bench, "--help"], capsys)


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    out = _help(["--help"], capsys)
    assert all(f"  {name} " in out for name in COMMANDS)


def test_unknown_command_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-command"]) == 2
    assert "unknown command" in capsys.readouterr().err
