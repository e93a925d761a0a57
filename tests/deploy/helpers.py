"""Shared checks of the deployment files against the real CLI, config models and metrics.

- `check_command(argv, env, files)`: a `bubblespec <cmd> ...` command line as a container runs
  it: the subcommand exists, its parser takes the flags, every `BUBBLESPEC_*` variable is a
  field of that role's config, and the merged config (flags > env > YAML file) validates.
- `declared_metrics()`: every series name the metrics modules can expose (counters with
  `_total`, histograms with `_bucket`/`_sum`/`_count`), read from real registries.
- `metric_names(expr)`: the `bubblespec_*` names a PromQL expression uses.

`compose-spec.json` beside this file is the Compose Specification's JSON schema
(github.com/compose-spec/compose-spec, schema/compose-spec.json at commit 170098b,
Apache-2.0), vendored so that the compose file is checked offline.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bubblespec.cli.main import COMMANDS
from bubblespec.config import ConfigError, build_parser, env_var, load_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Role:
    """A config-model subcommand: its model and env prefix."""

    model: type[BaseModel]
    env_prefix: str


def roles() -> dict[str, Role]:
    from bubblespec.gateway.config import ENV_PREFIX as GW_PREFIX
    from bubblespec.gateway.config import GatewayConfig
    from bubblespec.rank.config import ENV_PREFIX as RANK_PREFIX
    from bubblespec.rank.config import RankConfig
    from bubblespec.synchronizer.config import SyncConfig

    return {"sync": Role(SyncConfig, "BUBBLESPEC_"), "rank": Role(RankConfig, RANK_PREFIX),
            "gateway": Role(GatewayConfig, GW_PREFIX)}


def role_env_vars(role: Role) -> set[str]:
    """Every env var a role reads: one per field, plus `<prefix>CONFIG`."""
    names = {env_var(f, role.env_prefix) for f in role.model.model_fields}
    return names | {env_var("config", role.env_prefix)}


def plain_parser(command: str) -> argparse.ArgumentParser | None:
    """The argparse parser of a subcommand without a config model (health, up)."""
    if command == "health":
        from bubblespec.cli.health import build_parser as health_parser

        return health_parser()
    return None


class CommandError(AssertionError):
    pass


def parse_or_fail(parser: argparse.ArgumentParser, argv: Sequence[str], where: str) -> Any:
    """argparse, turning its SystemExit into an assertion naming `where`."""
    try:
        return parser.parse_args(list(argv))
    except SystemExit as e:
        raise CommandError(f"{where}: `{' '.join(argv)}` is rejected by the CLI "
                           f"(argparse exit {e.code})") from None


def check_command(argv: Sequence[str], env: Mapping[str, str] | None = None, *,
                  files: Mapping[str, Path] | None = None, where: str = "") -> Any:
    """Validate `bubblespec <argv...>` with `env` as the container would run it.

    `files` maps container paths (a `--config` or `*_CONFIG` value) to files in the repo.
    Returns the loaded config (model roles) or the argparse namespace (others).
    """
    argv = list(argv)
    env = dict(env or {})
    if argv and argv[0] == "bubblespec":
        argv = argv[1:]
    if not argv:
        raise CommandError(f"{where}: empty bubblespec command")
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        raise CommandError(f"{where}: `bubblespec {command}` is not a command "
                           f"(commands: {', '.join(COMMANDS)})")
    if command == "up":
        from bubblespec.cli.up import parse_args

        try:
            return parse_args(rest)
        except SystemExit as e:
            raise CommandError(f"{where}: `bubblespec up {' '.join(rest)}` rejected "
                               f"(exit {e.code})") from None
    role = roles().get(command)
    if role is None:
        parser = plain_parser(command)
        if parser is None:
            raise CommandError(f"{where}: no parser known for `bubblespec {command}`")
        return parse_or_fail(parser, rest, where)
    # 1. the flags exist (argparse, with the same parser `bubblespec <cmd> --help` shows)
    parse_or_fail(build_parser(role.model, env_prefix=role.env_prefix), rest, where)
    # 2. every BUBBLESPEC_* variable is read by this role
    known = role_env_vars(role)
    for name in env:
        if name.startswith("BUBBLESPEC_") and name not in known:
            raise CommandError(
                f"{where}: env {name} is not a setting of `bubblespec {command}` "
                f"(its variables are {role.env_prefix}<FIELD>, e.g. "
                f"{sorted(known)[:3]}...)")
    # 3. the merged configuration validates (config file paths mapped into the repo)
    files = dict(files or {})
    rest = [str(files.get(a, a)) for a in rest]
    cfg_var = env_var("config", role.env_prefix)
    if cfg_var in env:
        path = env[cfg_var]
        if path not in files:
            raise CommandError(f"{where}: {cfg_var}={path} is not a file this test knows")
        env[cfg_var] = str(files[path])
    try:
        return load_config(role.model, rest, env=env, env_prefix=role.env_prefix)
    except ConfigError as e:
        raise CommandError(f"{where}: `bubblespec {' '.join(argv)}`: {e}") from None


# ---------------------------------------------------------------------- metrics

_METRIC = re.compile(r"\bbubblespec_[a-zA-Z0-9_]*[a-zA-Z0-9]")


def metric_names(expr: str) -> set[str]:
    """`bubblespec_*` series names used in a PromQL expression (label values with `-` and
    recording-rule names with `:` do not match)."""
    return set(_METRIC.findall(expr))


def declared_metrics() -> dict[str, str]:
    """{exposed series name: family type} of every bubblespec metric (all three roles)."""
    from bubblespec.metrics import new_registry
    from bubblespec.metrics.gateway import GatewayMetrics
    from bubblespec.metrics.rank import new_rank_metrics
    from bubblespec.metrics.sync import SyncLevels, SyncMetrics

    sync_reg = new_registry("synchronizer")
    SyncMetrics(sync_reg).watch_levels(lambda: SyncLevels())
    gw_reg = new_registry("gateway")
    GatewayMetrics(gw_reg).watch_ranks(lambda: (0, 0))
    rank_reg = new_rank_metrics("r0").registry
    out: dict[str, str] = {}
    for reg in (sync_reg, gw_reg, rank_reg):
        for fam in reg.collect():
            if fam.type == "counter":
                out[fam.name + "_total"] = "counter"
            elif fam.type == "histogram":
                for suffix in ("_bucket", "_sum", "_count"):
                    out[fam.name + suffix] = "histogram"
            elif fam.type == "summary":
                for suffix in ("", "_sum", "_count"):
                    out[fam.name + suffix] = "summary"
            else:
                out[fam.name] = fam.type
    return out


def unknown_metrics(expr: str, declared: Mapping[str, str]) -> set[str]:
    return {m for m in metric_names(expr) if m not in declared}


# ---------------------------------------------------------------------- tools


_APT_UPDATED = False


def ensure_tool(binary: str, package: str, timeout_s: float = 900) -> str | None:
    """Path of `binary`; if missing, install Debian's `package` with apt-get when running as
    root (the test setup of the observability tests). None when that is impossible."""
    global _APT_UPDATED
    found = shutil.which(binary)
    if found or os.environ.get("BUBBLESPEC_TEST_NO_APT"):
        return found
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        return None
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        if not _APT_UPDATED:
            subprocess.run([apt, "update", "-qq"], capture_output=True, timeout=timeout_s,
                           env=env, check=False)
            _APT_UPDATED = True
        subprocess.run([apt, "install", "-y", "-qq", package],
                       capture_output=True, timeout=timeout_s, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return shutil.which(binary)


def promtool() -> str | None:
    """promtool (Debian's `prometheus` package), installed on first use when possible."""
    return ensure_tool("promtool", "prometheus")


def run(argv: Sequence[str], timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          check=False, **kw)


_INTERP = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def interpolate(value: Any, env: Mapping[str, str] | None = None) -> Any:
    """Compose-style `${VAR}` / `${VAR:-default}` interpolation, recursively ($$ -> $)."""
    env = env or {}
    if isinstance(value, str):
        out = _INTERP.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)
        return out.replace("$$", "$")
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def env_mapping(env: Any) -> dict[str, str]:
    """A compose `environment:` (mapping or list of KEY=VALUE) as a dict of strings."""
    if env is None:
        return {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def engine_model_dir() -> str | None:
    """The model the engine tests use: $BUBBLESPEC_TEST_MODEL, else the embedded one."""
    if os.environ.get("BUBBLESPEC_TEST_MODEL"):
        return os.environ["BUBBLESPEC_TEST_MODEL"]
    try:
        from bubblespec.tasks import default_model_dir

        return str(default_model_dir())
    except FileNotFoundError:
        return None

