"""Trainer side of the demo and benchmarks: a small GRPO learner in torch (CPU).

The service never imports this package; it exists so that `make run`, the engine
benchmark and `examples/grpo.py` run a real RL loop against real rollouts.
"""
