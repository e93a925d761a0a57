"""Trainer side of the demo and benchmarks: a small GRPO learner in torch (CPU).

`grpo` is the learner, `schedule` the GRPO loop through the rollout service (rollout ->
reward -> train -> push weights), `demo` the `bubblespec train-demo` driver. The service
never imports this package; it exists so that `bubblespec train-demo`, the benchmarks and
`examples/grpo.py` run a real RL loop against real rollouts.
"""
