"""The benchmarks behind the README's measured figures, one module per benchmark.

`modes` (the rollout modes, per-step figures, totals, reductions and tables; pure),
`service` (the GRPO schedule through the service under each mode, `bubblespec bench
service`), `engine` (one vLLM engine per speculation mode, `bubblespec bench engine`),
`suffix` (the draft index against arctic-inference, `bubblespec bench suffix`),
`per_request` (which response sets each step's critical path), `sync_latency` (the
synchronizer's own RPC cost, `bubblespec bench sync`) and `run` (the `bubblespec run` /
`make run` driver and its per-step table). Each is imported only by the command that runs it:
`engine` loads vLLM.
"""
