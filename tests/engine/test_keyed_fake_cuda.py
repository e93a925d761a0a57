"""GPU faithfulness without a GPU: the keyed sampler, the keyed verifier and the proposer's
per-step call run with CUDA tensors under torch's `FakeTensorMode`.

A fake CUDA tensor mixed with a host tensor raises `FakeTensorDeviceMismatchError`, and a
value read back to the host (`.item()`, `.tolist()`, Python branching on a tensor) raises
`DataDependentOutputException`: what a first CUDA step would hit as a crash or a hidden
sync. The model runner here is vLLM's host state as the keyed path reads it (request ids,
prompt and token counts as numpy arrays, each request's real `vllm.SamplingParams`); the
logits, drafts and bonus tokens are fake CUDA tensors.

Named syncs that stay: vLLM's own top-k/top-p masking on its PyTorch path reads `k.max()`
(vLLM's sampler does the same without bubblespec; its CUDA path is Triton), so the sampler
is driven here without top-k (top-p alone is masked by vLLM with a sort on the device but
its CPU build cannot place a CUDA sort: not run); context keys (`keyed_context`) read the
drafted ids back to the host, the slow path `engine/keyed.py` names (checked to raise here).
Negative controls: keys built on the host, and a `.tolist()` put back into the verifier,
are both caught.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    FakeTensorDeviceMismatchError,
    FakeTensorMode,
)

from bubblespec.engine import keyed as keyed_mod
from bubblespec.engine import keyed_kernels as kk
from bubblespec.engine.sampling import CONTEXT_ARG, KEY_ARG

CUDA = torch.device("cuda:0")
VOCAB = 512
K = 4


def _runner(keyed: list[bool], context: bool = False, greedy_row: int | None = None):
    """vLLM's model-runner state as the keyed path reads it: 6-token prompts, rows that have
    committed 3 + row output tokens; `keyed[i]`: row i is a keyed request."""
    from vllm import SamplingParams

    rows = len(keyed)
    req_ids = [f"g{i}/0#r{i}" for i in range(rows)]
    requests = {}
    for i, rid in enumerate(req_ids):
        extra = {KEY_ARG: 1000 + i, CONTEXT_ARG: True} if context else {KEY_ARG: 1000 + i}
        temp = 0.0 if i == greedy_row else 1.0
        requests[rid] = SimpleNamespace(sampling_params=SamplingParams(
            temperature=temp, extra_args=extra if keyed[i] else None))
    n_tok = np.array([6 + 3 + i for i in range(rows)], dtype=np.int32)
    batch = SimpleNamespace(req_ids=req_ids, num_prompt_tokens=np.full(rows, 6, np.int32),
                            num_tokens_no_spec=n_tok,
                            token_ids_cpu=np.arange(rows * 64, dtype=np.int32).reshape(rows, 64)
                            % VOCAB)
    sampler = SimpleNamespace(topk_topp_sampler=SimpleNamespace(logprobs_mode="raw_logprobs"))
    return SimpleNamespace(input_batch=batch, requests=requests, sampler=sampler)


def _vllm_sampler(logits: torch.Tensor, generators: dict, k, p):
    """The part of vLLM's native sampler that runs on the device: Gumbel-max over the
    softmax (its `random_sample` without per-request generators)."""
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs).exponential_()
    return probs.div(q).argmax(dim=-1).view(-1), None


def _spec_step(rows: int):
    counts = [(i % (K + 1)) for i in range(rows)]
    cu = torch.tensor(np.cumsum(counts), dtype=torch.int32).to(CUDA)
    total = sum(counts)
    return (counts, cu, torch.zeros(total, dtype=torch.int32, device=CUDA),
            torch.empty(total, VOCAB, device=CUDA),
            torch.zeros(rows, 1, dtype=torch.int32, device=CUDA))


@pytest.fixture(autouse=True)
def _eager(monkeypatch):
    """The eager twin (the compiled kernel is checked against it on the device itself,
    `keyed_kernels.compiled_agrees`, which needs real tensors)."""
    monkeypatch.setenv(kk.BACKEND_ENV, "eager")


@pytest.mark.parametrize("keyed", [[True] * 6, [True, False, True, True, False, True]])
def test_sampler_on_fake_cuda(keyed: list[bool]) -> None:
    ks = keyed_mod.KeyedSampling(_runner(keyed))
    sample = ks.wrap_sample(_vllm_sampler)
    with FakeTensorMode():
        logits = torch.empty(len(keyed), VOCAB, device=CUDA)
        sampled, _ = sample(logits, {}, None, None)
        assert sampled.device == CUDA and sampled.shape == (len(keyed),)
        counts, _, drafts, _, _ = _spec_step(len(keyed))
        ks.set_spec((counts, drafts))  # the bonus tokens of a speculative step
        sampled, _ = sample(logits, {}, None, None)
        assert sampled.device == CUDA


@pytest.mark.parametrize("keyed,greedy", [([True] * 6, None),
                                          ([True, False, True, True, False, True], None),
                                          ([True] * 6, 2)])
def test_verifier_on_fake_cuda(keyed: list[bool], greedy: int | None) -> None:
    ks = keyed_mod.KeyedSampling(_runner(keyed, greedy_row=greedy))
    charged = []
    ks.charge_to(lambda host_s, positions, launches: charged.append((positions, launches)))
    rows = len(keyed)
    calls = []

    def vllm_verify() -> torch.Tensor:
        calls.append(1)
        return torch.full((rows, K + 1), -1, dtype=torch.int32, device=CUDA)

    with FakeTensorMode():
        counts, cu, drafts, target, bonus = _spec_step(rows)
        out = ks.verify(vllm_verify, drafts, counts, K, cu, target, bonus)
        assert out.device == CUDA and out.shape == (rows, K + 1) and out.dtype == torch.int32
    # vLLM's rejection sampler runs only when some row is not keyed (or greedy)
    assert len(calls) == (0 if all(keyed) and greedy is None else 1)
    # the pacer is told the keyed drafted positions and the kernels' launches
    counts = [i % (K + 1) for i in range(rows)]
    mine = [i for i in range(rows) if keyed[i] and i != greedy]
    assert charged == [(sum(counts[i] for i in mine), kk.FUSED_STEP_LAUNCHES)]


def test_host_keys_are_caught(monkeypatch) -> None:
    """Negative control: the keys left on the host (the defect this test exists for)."""
    monkeypatch.setattr(keyed_mod, "_dev", lambda values, device: torch.as_tensor(
        np.asarray(values, dtype=np.int64)))
    ks = keyed_mod.KeyedSampling(_runner([True] * 4))
    sample = ks.wrap_sample(_vllm_sampler)
    with FakeTensorMode(), pytest.raises(FakeTensorDeviceMismatchError):
        sample(torch.empty(4, VOCAB, device=CUDA), {}, None, None)


def test_host_sync_in_the_verifier_is_caught(monkeypatch) -> None:
    """Negative control: a drafted-id read-back put into the position-key path."""
    layout = kk.draft_layout

    def syncing_layout(cu: torch.Tensor, num_tokens: int):
        if bool(cu.sum() < 0):  # a Python branch on a device value: a host sync
            raise AssertionError
        return layout(cu, num_tokens)

    monkeypatch.setattr(kk, "draft_layout", syncing_layout)
    ks = keyed_mod.KeyedSampling(_runner([True] * 4))
    with FakeTensorMode(), pytest.raises(DataDependentOutputException):
        counts, cu, drafts, target, bonus = _spec_step(4)
        ks.verify(lambda: None, drafts, counts, K, cu, target, bonus)


def test_context_keys_are_the_named_slow_path() -> None:
    """Context keys read the drafted ids on the host (the documented sync)."""
    ks = keyed_mod.KeyedSampling(_runner([True] * 4, context=True))
    with FakeTensorMode():
        counts, cu, drafts, target, bonus = _spec_step(4)
        with pytest.raises(DataDependentOutputException):
            ks.verify(lambda: None, drafts, counts, K, cu, target, bonus)
        # without drafts (a plain decode step) context keys come from host tokens only
        sampled, _ = ks.wrap_sample(_vllm_sampler)(torch.empty(4, VOCAB, device=CUDA), {},
                                                     None, None)
        assert sampled.device == CUDA


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=__import__("tests.core.batch_cases", fromlist=["batch_case"]).batch_case())
def test_proposer_step_touches_no_device_tensor(case) -> None:
    """The proposer's per-step call works on vLLM's host copies (sampled ids as lists,
    token counts as numpy) and returns lists, which vLLM copies to the device: under fake
    CUDA it runs unchanged, because it creates and reads no tensor."""
    from bubblespec.core.backend import Request, SuffixIndex, step
    from tests.core.batch_cases import drive

    with FakeTensorMode():
        log = drive(SuffixIndex, Request, step, case, steps=10)
    assert all(isinstance(d, list) for entry in log for d in entry[0])
