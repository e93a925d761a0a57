"""GRPO through bubblespec: a local 2-rank cluster (or `--gateway URL`), rollouts with the
next step's prompts passed ahead, rewards from the embedded task, a torch GRPO step, weights
saved and pushed every step. Same code as `bubblespec train-demo`; see
`bubblespec/train/schedule.py` for the loop (`run_grpo`).

    python examples/grpo.py --steps 20 --prompts 8 --n 8 [--model DIR] [--out out/grpo]
"""

import sys

from bubblespec.cli.train_demo import main

if __name__ == "__main__":  # vLLM spawns processes: keep the guard
    sys.exit(main())
