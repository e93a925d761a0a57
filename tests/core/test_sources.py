"""The draft sources' one vocabulary (`core.sources`) and the drafter seam
(`core.drafters`): names parsed and checked in one place, read the same way by the rank's
configuration, the bench modes and the simulator; the registered drafters the same in
Python and in the native step."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bubblespec.config import load_config
from bubblespec.core.drafters import DRAFTERS
from bubblespec.core.sources import (
    DEFAULT_SOURCES,
    DRAFTER_NAMES,
    SOURCE_NAMES,
    SOURCES,
    feeding,
    parse_sources,
    sources_flag,
)
from bubblespec.engine.config import EngineConfig


def test_names_are_parsed_into_the_canonical_order_once_each() -> None:
    assert parse_sources("global, pregen,pregen") == ("pregen", "global")
    assert parse_sources(["self", "siblings"]) == ("siblings", "self")
    assert parse_sources("none") == parse_sources("") == parse_sources(None) == ()
    assert parse_sources(SOURCE_NAMES) == SOURCE_NAMES
    with pytest.raises(ValueError, match="unknown draft source 'self_context'.*known: pregen"):
        parse_sources("pregen,self_context")


def test_every_source_feeds_a_registered_drafter() -> None:
    assert tuple(d.name for d in DRAFTERS) == DRAFTER_NAMES
    for s in SOURCES:
        assert s.feeds and set(s.feeds) <= set(DRAFTER_NAMES), s
    assert feeding("aligned", SOURCE_NAMES) == ("pregen",)
    assert feeding("group", DEFAULT_SOURCES) == ("pregen", "siblings", "self")
    assert feeding("global", ("siblings", "global_live")) == ("global_live",)
    assert "history" not in DEFAULT_SOURCES


def test_the_native_step_registers_the_same_drafters_in_the_same_order() -> None:
    nat = pytest.importorskip("bubblespec_native")
    assert nat.DRAFTER_NAMES == DRAFTER_NAMES


@pytest.mark.parametrize("given, env, want", [
    ([], {}, DEFAULT_SOURCES),
    (["--sources", "pregen,history"], {}, ("pregen", "history")),
    (["--sources=none"], {}, ()),
    ([], {"BUBBLESPEC_SOURCES": "siblings,global"}, ("siblings", "global")),
    ([], {"BUBBLESPEC_SOURCES": "[self, pregen]"}, ("pregen", "self")),
])
def test_the_rank_flag_env_var_and_default_name_the_sources(given, env, want) -> None:
    cfg = load_config(EngineConfig, given, env=env)
    assert cfg.sources == want
    assert load_config(EngineConfig, [sources_flag(cfg.sources)], env={}).sources == want


def test_an_unknown_source_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="sources"):
        EngineConfig(sources="pregen,siblingz")
    cfg = EngineConfig(sources=("global",), defer_appends=True)
    assert cfg.sources == ("global",) and cfg.defer_appends
