"""The rank tests' real vLLM engine (defined in tests/engine_fixtures.py; package scope)."""

from tests.engine_fixtures import loop_runner, spec_engine

__all__ = ["loop_runner", "spec_engine"]
