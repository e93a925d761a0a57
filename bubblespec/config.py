"""Generic config loading for pydantic models: CLI flags > env vars > YAML file > defaults.

Every role (synchronizer, rank, gateway) declares one flat `BaseConfig` model whose fields each
carry a description (an attribute docstring or `Field(description=...)`); `build_parser` turns
the model into an argparse parser whose `--help` is those descriptions, `load_config` merges
the four sources, and `effective_config_dict` gives the result for logs and a `/config` route
(secrets typed `SecretStr` come out masked). Values from env and CLI arrive as strings and are
coerced by pydantic; list/dict/model fields take JSON or YAML flow syntax (`[1, 2]`).
"""

from __future__ import annotations

import argparse
import enum
import os
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound=BaseModel)

DEFAULT_ENV_PREFIX = "BUBBLESPEC_"
_NONE_WORDS = {"", "none", "null"}


class BaseConfig(BaseModel):
    """Base for config models: unknown keys are errors, attribute docstrings become help."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class ConfigError(ValueError):
    """The merged configuration is invalid; the message names the field and the sources."""


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """(inner type, accepts None) of `X | None` / `Optional[X]`; other annotations unchanged."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(typing.get_args(annotation))
    return annotation, False


def _is_structured(annotation: Any) -> bool:
    """True for list/dict/set/tuple/model fields, which take JSON/YAML text from env and CLI."""
    origin = typing.get_origin(annotation) or annotation
    if isinstance(origin, type):
        return issubclass(origin, (list, dict, set, tuple, frozenset, BaseModel))
    return False


def _coerce_text(model: type[BaseModel], name: str, raw: str) -> Any:
    """Turn an env/CLI string into what pydantic should validate for field `name`."""
    inner, nullable = _unwrap_optional(model.model_fields[name].annotation)
    if nullable and raw.strip().lower() in _NONE_WORDS:
        return None
    if _is_structured(inner):
        return yaml.safe_load(raw)
    return raw


def env_var(name: str, prefix: str = DEFAULT_ENV_PREFIX) -> str:
    """The environment variable of field `name`: `BUBBLESPEC_<NAME>` by default."""
    return f"{prefix}{name.upper()}"


def build_parser(
    model: type[BaseModel],
    *,
    prog: str | None = None,
    description: str | None = None,
    env_prefix: str = DEFAULT_ENV_PREFIX,
) -> argparse.ArgumentParser:
    """An argparse parser with `--config PATH` and one `--field-name` flag per model field.

    Flags default to "not given" (argparse.SUPPRESS) so that lower-precedence sources show
    through. Bool fields get `--flag/--no-flag`. Raises TypeError for an undescribed field.
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description or (model.__doc__ or "").strip() or None,
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--config", metavar="PATH", help=f"YAML file of settings (env {env_var('config', env_prefix)})"
    )
    for name, info in model.model_fields.items():
        if not info.description:
            raise TypeError(f"{model.__name__}.{name} has no description (docstring or Field)")
        inner, _ = _unwrap_optional(info.annotation)
        default = "unset" if info.default is None else info.get_default(call_default_factory=True)
        if isinstance(default, enum.Enum):
            default = default.value
        help_ = (f"{info.description.strip()} [default: {default}; env "
                 f"{env_var(name, env_prefix)}]").replace("%", "%%")  # argparse formats help
        flag = "--" + name.replace("_", "-")
        if inner is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, help=help_)
            continue
        choices = None
        if typing.get_origin(inner) is typing.Literal:
            choices = [str(c) for c in typing.get_args(inner)]
        elif isinstance(inner, type) and issubclass(inner, enum.Enum):
            choices = [str(c.value) for c in inner]
        metavar = None if choices else name.upper()
        parser.add_argument(flag, dest=name, metavar=metavar, choices=choices, help=help_)
    return parser


def _read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML config file (an empty file is an empty mapping)."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"--config {path}: cannot read: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of settings, got {type(data)}")
    return data


def load_config(
    model: type[M],
    argv: Sequence[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    env_prefix: str = DEFAULT_ENV_PREFIX,
    prog: str | None = None,
) -> M:
    """Parse `argv` and merge CLI > env (`<prefix><FIELD>`) > YAML (`--config`) > defaults.

    `argv=None` reads sys.argv; `env=None` reads os.environ. `--help` exits (argparse).
    Raises ConfigError naming the field and where its bad value came from.
    """
    env = os.environ if env is None else env
    parser = build_parser(model, prog=prog, env_prefix=env_prefix)
    given = vars(parser.parse_args(argv))
    path = given.pop("config", None) or env.get(env_var("config", env_prefix))
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if path:
        for key, value in _read_yaml(path).items():
            values[key], sources[key] = value, f"file {path}"
    for name in model.model_fields:
        var = env_var(name, env_prefix)
        if var in env:
            values[name], sources[name] = _coerce_text(model, name, env[var]), f"env {var}"
    for name, raw in given.items():
        values[name] = raw if isinstance(raw, bool) else _coerce_text(model, name, raw)
        sources[name] = "--" + name.replace("_", "-")
    try:
        return model.model_validate(values)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            if not err["loc"]:
                problems.append(err["msg"])
                continue
            where = sources.get(str(err["loc"][0]), "default")
            problems.append(f"{'.'.join(map(str, err['loc']))} ({where}): {err['msg']}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from e


def effective_config_dict(config: BaseModel) -> dict[str, Any]:
    """The config as JSON-ready data, `SecretStr` values masked: for logs and `/config`."""
    return config.model_dump(mode="json")
