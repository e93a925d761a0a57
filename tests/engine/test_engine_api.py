"""Engine behaviour on a real vLLM engine: bad input does not disturb serving, early
stop returns partial outputs, weights reload in place with a version tag."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bubblespec.core.sources import DEFAULT_SOURCES
from bubblespec.engine import GenRequest
from bubblespec.protocol.errors import ApiError, InvalidRequest
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.tasks import default_task
from tests.engine_fixtures import model_dir

pytestmark = pytest.mark.engine


def _greedy(prompts: list, max_new: int = 48) -> list[GenRequest]:
    sp = SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True)
    return [GenRequest(input_ids=list(p.input_ids), n=1, sampling=sp) for p in prompts]


def test_bad_request_rejected_and_engine_keeps_serving(loop_runner, spec_engine) -> None:
    bad = GenRequest(input_ids=[spec_engine.vocab_size + 5])
    with pytest.raises(InvalidRequest) as e:
        loop_runner.run(spec_engine.generate([bad]))
    assert e.value.field == "input_ids[0]"
    too_long = GenRequest(input_ids=[1], sampling=SamplingParams(
        max_new_tokens=spec_engine.max_model_len + 1))
    with pytest.raises(InvalidRequest):
        loop_runner.run(spec_engine.generate([too_long]))
    res = loop_runner.run(spec_engine.generate(_greedy(default_task().make_prompts(2, 1))))
    assert all(len(r.samples[0].output_ids) == 48 for r in res)


def test_stop_hook_returns_partial_outputs(loop_runner, spec_engine) -> None:
    polls = []

    async def should_stop() -> bool:
        polls.append(1)
        return len(polls) >= 2

    reqs = [GenRequest(input_ids=list(p.input_ids), n=2, sampling=SamplingParams(
        max_new_tokens=400, temperature=1.0, ignore_eos=True))
        for p in default_task().make_prompts(3, 2)]
    res = loop_runner.run(spec_engine.generate(reqs, should_stop=should_stop, poll_every=4))
    samples = [s for r in res for s in r.samples]
    assert len(polls) == 2
    assert all(s.finish_reason == "abort" for s in samples)
    assert all(0 < len(s.output_ids) < 400 for s in samples)
    assert all(len(s.output_logprobs) == len(s.output_ids) for s in samples)
    # stopped within T=4 decode steps of the second poll (8 steps), plus the in-flight step
    assert max(s.decode_steps for s in samples) <= 8 + 4 + 1


def test_weight_reload_changes_outputs_and_tags_version(loop_runner, spec_engine,
                                                        tmp_path: Path) -> None:
    reqs = _greedy(default_task().make_prompts(3, 9))
    before = loop_runner.run(spec_engine.generate(reqs))
    v0 = before[0].samples[0].weight_version
    src = Path(model_dir())
    new = tmp_path / "perturbed"
    shutil.copytree(src, new)
    weights = load_file(str(src / "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    weights = {k: v + 0.05 * torch.randn(v.shape, generator=gen) if v.ndim == 2 else v
               for k, v in weights.items()}
    save_file(weights, str(new / "model.safetensors"), metadata={"format": "pt"})
    assert loop_runner.run(spec_engine.update_weights(str(new))) == v0 + 1
    after = loop_runner.run(spec_engine.generate(reqs))
    assert after[0].samples[0].weight_version == v0 + 1
    assert [r.samples[0].output_ids for r in after] != [r.samples[0].output_ids for r in before]
    assert loop_runner.run(spec_engine.update_weights(str(src), version=v0 + 2)) == v0 + 2
    again = loop_runner.run(spec_engine.generate(reqs))
    assert [r.samples[0].output_ids for r in again] == [r.samples[0].output_ids for r in before]
    with pytest.raises(ApiError) as e:
        loop_runner.run(spec_engine.update_weights(str(tmp_path / "missing")))
    assert (e.value.status, e.value.field) == (422, "path")
    with pytest.raises(ApiError) as e:  # versions only go up, unless forced
        loop_runner.run(spec_engine.update_weights(str(new), version=v0 + 1))
    assert (e.value.status, e.value.field) == (409, "version")
    assert loop_runner.run(spec_engine.update_weights(str(src), version=v0 + 1,
                                                      force=True)) == v0 + 1
    assert spec_engine.last_good_path == str(src)


def test_global_pool_drafts_across_prompt_groups(loop_runner, spec_engine) -> None:
    """A finished response to one group drafts for another group only via the global pool
    (pre-gen, siblings and self off, so nothing else can draft)."""
    p = default_task().make_prompts(1, 77)[0]

    def second_accepts(global_pool: bool) -> tuple[int, int, list[int]]:
        loop_runner.run(spec_engine.set_sources(["global"] if global_pool else []))
        a, b = _greedy([p, p], max_new=64)
        a.group, b.group = "pool-a", "pool-b"
        first = loop_runner.run(spec_engine.generate([a]))[0].samples[0]
        loop_runner.run(spec_engine.release_groups(["pool-a"]))
        s = loop_runner.run(spec_engine.generate([b]))[0].samples[0]
        loop_runner.run(spec_engine.release_groups(["pool-b"]))
        assert s.output_ids == first.output_ids  # greedy: drafts never change the output
        return s.num_accepted_tokens, len(s.output_ids), s.output_ids

    try:
        acc_on, n_on, ids_on = second_accepts(True)
        acc_off, _, ids_off = second_accepts(False)
    finally:
        loop_runner.run(spec_engine.set_sources(DEFAULT_SOURCES))
    assert acc_off == 0 and ids_on == ids_off
    assert acc_on >= n_on // 2, (acc_on, n_on)


def test_release_right_after_uncounted_requests_keeps_the_engine_up(loop_runner,
                                                                    spec_engine) -> None:
    """Pre-generation skips the counter RPC, so its requests are still tracked by the
    proposer when their groups are released; the engine must keep serving, and their
    uncollected counters go with the groups (a long run does not accumulate them)."""
    task = default_task()
    reqs = _greedy(task.make_prompts(2, 5), 16)
    before = loop_runner.run(spec_engine.index_stats())["finished_stats"]
    loop_runner.run(spec_engine.generate(reqs, counters=False))
    loop_runner.run(spec_engine.release_groups([r.group_key() for r in reqs]))
    assert loop_runner.run(spec_engine.index_stats())["finished_stats"] == before
    res = loop_runner.run(spec_engine.generate(_greedy(task.make_prompts(2, 6), 16)))
    assert [len(g.samples[0].output_ids) for g in res] == [16, 16]
