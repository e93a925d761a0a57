"""The generic config loader (`bubblespec.config`): precedence, coercion, help, errors."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field, SecretStr

from bubblespec.config import (
    BaseConfig,
    ConfigError,
    build_parser,
    effective_config_dict,
    load_config,
)


class Demo(BaseConfig):
    """A demo role."""

    port: int = 8000
    """Port to serve on."""
    ratio: float = Field(0.5, ge=0, le=1, description="A fraction.")
    verbose: bool = False
    """Chatty logs."""
    tags: list[str] = Field(default_factory=list)
    """Tags (JSON or YAML list)."""
    limit: int | None = None
    """Optional limit."""
    mode: Literal["a", "b"] = "a"
    """Mode."""
    secret: SecretStr | None = None
    """A token."""


def test_precedence_cli_over_env_over_file_over_defaults(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("port: 1\nratio: 0.1\ntags: [x]\nmode: b\n")
    env = {"BUBBLESPEC_PORT": "2", "BUBBLESPEC_RATIO": "0.2", "BUBBLESPEC_VERBOSE": "true"}
    c = load_config(Demo, ["--config", str(f), "--port", "3"], env=env)
    assert (c.port, c.ratio, c.verbose, c.tags, c.mode, c.limit) == (3, 0.2, True, ["x"], "b",
                                                                    None)
    assert load_config(Demo, [], env={}) == Demo()
    env = {"BUBBLESPEC_CONFIG": str(f), "BUBBLESPEC_TAGS": '["a", "b"]',
           "BUBBLESPEC_LIMIT": "none"}
    c = load_config(Demo, ["--no-verbose", "--limit", "7"], env=env)
    assert (c.port, c.tags, c.limit, c.verbose) == (1, ["a", "b"], 7, False)
    c = load_config(Demo, ["--tags", "[p, q]"], env={"APP_PORT": "9"}, env_prefix="APP_")
    assert (c.tags, c.port) == (["p", "q"], 9)


def test_errors_name_field_and_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"ratio \(env BUBBLESPEC_RATIO\)"):
        load_config(Demo, [], env={"BUBBLESPEC_RATIO": "2"})
    with pytest.raises(ConfigError, match=r"port \(--port\)"):
        load_config(Demo, ["--port", "x"], env={})
    f = tmp_path / "c.yaml"
    f.write_text("prot: 1\n")
    with pytest.raises(ConfigError, match="prot"):
        load_config(Demo, ["--config", str(f)], env={})
    f.write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(Demo, ["--config", str(f)], env={})
    with pytest.raises(SystemExit):
        load_config(Demo, ["--mode", "c"], env={})  # argparse choices


def test_help_comes_from_descriptions_and_undescribed_fields_fail() -> None:
    text = build_parser(Demo, prog="demo").format_help()
    for s in ("--port", "Port to serve on.", "A fraction.", "--verbose", "--no-verbose",
              "BUBBLESPEC_LIMIT", "{a,b}"):
        assert s in text

    class Bare(BaseConfig):
        x: int = 1

    with pytest.raises(TypeError, match="Bare.x"):
        build_parser(Bare)


def test_effective_config_masks_secrets() -> None:
    c = load_config(Demo, ["--secret", "hunter2"], env={})
    d = effective_config_dict(c)
    assert d["secret"] == "**********" and "hunter2" not in str(d)
    assert c.secret is not None and c.secret.get_secret_value() == "hunter2"
    assert d["port"] == 8000 and d["tags"] == []
