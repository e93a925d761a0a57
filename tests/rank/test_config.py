"""The rank's configuration carries every engine setting: each `EngineConfig` field is a
`bubblespec rank` flag, a `BUBBLESPEC_RANK_*` variable and a config-file key, reaches the
engine unchanged, and parsing it loads neither vLLM nor torch; the engine restart budget is
a rate (restarts per window), a flag and a variable like the rest."""

from __future__ import annotations

import enum
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest

from bubblespec.config import ConfigError, env_var, load_config
from bubblespec.engine.config import EngineConfig
from bubblespec.engine.types import SpecMode
from bubblespec.rank.config import ENV_PREFIX, RankConfig


def non_defaults() -> dict[str, Any]:
    """A valid value other than the default for every engine field."""
    out: dict[str, Any] = {}
    for name, info in EngineConfig.model_fields.items():
        default = info.get_default(call_default_factory=True)
        if isinstance(default, bool):
            out[name] = not default
        elif get_origin(info.annotation) is Literal:
            out[name] = next(a for a in get_args(info.annotation) if a != default)
        elif isinstance(default, tuple):  # names out of a Literal: one the default lacks
            (item,) = get_args(info.annotation)[:1]
            out[name] = (next(a for a in get_args(item) if a not in default),)
        elif isinstance(default, enum.Enum):
            out[name] = SpecMode.NGRAM if default != SpecMode.NGRAM else SpecMode.NONE
        elif isinstance(default, int):
            out[name] = default + 1
        elif isinstance(default, float):
            out[name] = default / 2 if default else 0.25
        else:
            out[name] = f"other-{default}"
    return out


def as_text(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(as_text, value))
    return str(value.value if isinstance(value, enum.Enum) else value)


def test_every_engine_field_is_a_rank_field() -> None:
    assert set(EngineConfig.model_fields) <= set(RankConfig.model_fields)
    for name, info in EngineConfig.model_fields.items():
        assert RankConfig.model_fields[name].description == info.description, name


def test_flags_reach_the_engine() -> None:
    want = non_defaults()
    argv: list[str] = []
    for name, value in want.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, as_text(value)]
    cfg = load_config(RankConfig, argv, env={}, env_prefix=ENV_PREFIX)
    assert cfg.engine_config() == EngineConfig(**want)


def test_env_and_file_reach_the_engine(tmp_path: Path) -> None:
    want = non_defaults()
    names = sorted(want)
    from_env, from_file = names[::2], names[1::2]
    env = {env_var(n, ENV_PREFIX): as_text(want[n]) for n in from_env}
    path = tmp_path / "rank.yaml"
    path.write_text("".join(f"{n}: {as_text(want[n])!r}\n" if isinstance(want[n], str)
                            else f"{n}: {as_text(want[n])}\n" for n in from_file))
    env[env_var("config", ENV_PREFIX)] = str(path)
    cfg = load_config(RankConfig, [], env=env, env_prefix=ENV_PREFIX)
    assert cfg.engine_config() == EngineConfig(**want)


def test_defaults_are_the_engine_defaults() -> None:
    assert RankConfig().engine_config() == EngineConfig()


def test_parsing_the_rank_config_loads_no_engine() -> None:
    script = textwrap.dedent("""
        import sys
        from bubblespec.config import load_config
        from bubblespec.rank.config import ENV_PREFIX, RankConfig

        cfg = load_config(RankConfig, ["--min-token-prob", "0.2"], env={},
                          env_prefix=ENV_PREFIX)
        assert cfg.engine_config().min_token_prob == 0.2
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "vllm")))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_engine_restart_budget_is_a_rate() -> None:
    """`engine_restarts` per `engine_restart_window_s`: both a flag and a variable."""
    cfg = RankConfig()
    assert (cfg.engine_restarts, cfg.engine_restart_window_s) == (3, 600.0)
    cfg = load_config(RankConfig, ["--engine-restarts", "5", "--engine-restart-window-s", "60"],
                      env={}, env_prefix=ENV_PREFIX)
    assert (cfg.engine_restarts, cfg.engine_restart_window_s) == (5, 60.0)
    env = {env_var("engine_restart_window_s", ENV_PREFIX): "30"}
    assert env == {"BUBBLESPEC_RANK_ENGINE_RESTART_WINDOW_S": "30"}
    assert load_config(RankConfig, [], env=env,
                       env_prefix=ENV_PREFIX).engine_restart_window_s == 30.0
    with pytest.raises(ConfigError, match="engine_restart_window_s"):
        load_config(RankConfig, ["--engine-restart-window-s", "0"], env={},
                    env_prefix=ENV_PREFIX)
