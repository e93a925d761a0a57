"""The engine tests' real vLLM engines (defined in tests/engine_fixtures.py; package scope)."""

from tests.engine_fixtures import biased_engine, loop_runner, plain_engine, spec_engine

__all__ = ["biased_engine", "loop_runner", "plain_engine", "spec_engine"]
