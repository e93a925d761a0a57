"""Faults injected on purpose: a wrong verifier and a poison prompt.

Never active unless an engine is started with a `fault_*` option (`EngineConfig`):

- `fault_biased_verifier`: the exactness tests' negative control (tests/engine). A verifier
  that accepts a draft token with probability min(1, boost * p) instead of p; the
  distribution tests must catch it, which shows that they would catch a real bias.
- `fault_poison_token`: the poison-request drills (tests/integration). The engine core
  raises on a prompt holding the token, as a real engine bug would, so that quarantine,
  failover and restarts are exercised on real processes.

The vLLM side of both (which kernel, which worker call) is `vllm_glue`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from bubblespec.engine import vllm_glue


def biased_verifier(boost: float) -> Callable[..., None]:
    """A rejection-sampling kernel (vLLM's signature) that over-accepts drafts by `boost`."""

    def impl(output_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
             draft_token_ids: torch.Tensor, draft_probs: Any, target_probs: torch.Tensor,
             bonus_token_ids: torch.Tensor, recovered_token_ids: torch.Tensor,
             uniform_probs: torch.Tensor, is_greedy: torch.Tensor, max_spec_len: int,
             vocab_size: int, *args: Any, **kwargs: Any) -> None:
        start = 0
        for r, end in enumerate(cu_num_draft_tokens.tolist()):
            if bool(is_greedy[r]):
                start = end
                continue
            pos, rejected = 0, False
            for pos, t in enumerate(range(start, end)):
                tok = int(draft_token_ids[t])
                p = float(target_probs[t, tok]) if tok >= 0 else 0.0
                if float(uniform_probs[t]) < min(1.0, boost * p):
                    output_token_ids[r, pos] = tok
                else:
                    output_token_ids[r, pos] = recovered_token_ids[t]
                    rejected = True
                    break
            if not rejected:
                output_token_ids[r, end - start] = bonus_token_ids.view(-1)[r]
            start = end

    return impl


def install_biased_verifier(boost: float) -> None:
    """Replace this process's verifier by `biased_verifier(boost)`."""
    vllm_glue.register_verifier(biased_verifier(boost))


def poison(token: int) -> Callable[[str, list[int]], None]:
    """A new-request hook that raises on a prompt holding `token`."""

    def check(req_id: str, prompt_ids: list[int]) -> None:
        if token in prompt_ids:
            raise RuntimeError(f"fault injection: request {req_id} holds the poison "
                               f"token {token}")

    return check


def install_poison(worker: Any, token: int) -> None:
    """Make `worker`'s forward raise (killing the engine core) on a prompt holding `token`."""
    vllm_glue.before_new_requests(worker, poison(token))
