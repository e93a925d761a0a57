"""Fixtures for the simulator tests (all figures modelled)."""

from __future__ import annotations

import pytest

from bubblespec.core.engine_time import EngineTime


@pytest.fixture
def et() -> EngineTime:
    """The default H100 engine-time model."""
    return EngineTime.preset("h100")
