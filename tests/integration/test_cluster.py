"""The whole system on loopback: a real `bubblespec sync`, two real rank servers (vLLM
engines on the embedded tiny model) and the gateway, all child processes of one
`LocalCluster` shared by this module (engines take ~20 s and ~1.2 GB each to start).

Order matters: the fault tests come last (synchronizer down and back, a rank killed
mid-step, then the last rank killed). Set BUBBLESPEC_TEST_MODEL to use another model dir.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bubblespec.client import BubbleSpecClient, BubbleSpecError, BubbleSpecUnavailable
from bubblespec.cluster import LocalCluster
from bubblespec.protocol.gateway import RolloutResponse
from bubblespec.tasks.addchain import MAX_STEPS
from tests.cluster.drills import check_result, fault_mid_step
from tests.cluster.helpers import local_cluster
from tests.deploy.helpers import engine_model_dir
from tests.integration.drafts import complete_draft

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # the rank defaults: one margin branch per keyed draft, streamed at the synchronizer's
    # calibrated threshold (only keyed hand-off steps make any); each rank serves the drafts
    # it pushed (rank to rank, the synchronizer saying where), so every test here that
    # fetches drafts reads them from their owners
    yield from local_cluster(tmp_path_factory, sync_args=["--heartbeat-interval-s", "0.5",
                                                          "--rank-timeout-s", "5"],
                             rank_args=["--drafts-port", "0"])


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[BubbleSpecClient]:
    with BubbleSpecClient(cluster.gateway_url, timeout_s=600) as c:
        yield c


@pytest.fixture(scope="module")
def task() -> Any:
    from bubblespec.tasks import default_task

    return default_task()


SAMPLING = {"temperature": 1.0, "max_new_tokens": 600}
LONG = {"temperature": 1.0, "max_new_tokens": 600, "ignore_eos": True}  # seconds of decoding


def test_rollout_in_request_order_over_both_ranks(client: BubbleSpecClient, task: Any) -> None:
    prompts = task.make_prompts(8, 101)
    res = client.rollout(prompts, n=3, sampling_params=SAMPLING)
    check_result(res, prompts, 3)
    assert res.warnings == []
    assert {r.rank_id for r in res.ranks if r.num_prompts} == {"r0", "r1"}
    assert len(res.weight_versions) == 1
    c = res.counters
    assert c.completion_tokens == sum(s.completion_tokens for p in res.prompts
                                      for s in p.samples)
    assert 1 <= c.decode_steps_critical <= c.decode_steps_total
    assert c.tokens_per_forward >= 1.0


def test_text_prompts_and_greedy_match_token_prompts(client: BubbleSpecClient,
                                                     task: Any) -> None:
    p = task.make_prompt(12, 7, 5)
    greedy = {"temperature": 0.0, "max_new_tokens": 100}
    a = client.rollout([p.text, p], n=2, sampling_params=greedy, return_logprobs=False)
    outs = [s.output_ids for pr in a.prompts for s in pr.samples]
    assert all(o == outs[0] for o in outs)
    assert a.prompts[0].input_ids == list(p.input_ids)
    assert a.prompts[0].samples[0].output_logprobs is None


def test_greedy_reproduces_across_steps_whatever_the_drafts(client: BubbleSpecClient,
                                                            task: Any) -> None:
    prompts = task.make_prompts(4, 202)
    greedy = {"temperature": 0.0, "max_new_tokens": 300}
    a = client.rollout(prompts, n=2, sampling_params=greedy, next_prompts=prompts)
    b = client.rollout(prompts, n=2, sampling_params=greedy)  # now with pre-generated drafts
    assert b.step == a.step + 1
    assert a.output_ids() == b.output_ids()


def test_repetition_penalty_reaches_rollouts_and_pregen(client: BubbleSpecClient,
                                                       task: Any) -> None:
    """HTTP -> gateway -> rank -> engine, and into the next step's pre-generation tasks."""
    prompts = task.make_prompts(4, 303)
    plain = {"temperature": 0.0, "max_new_tokens": 200}
    penalised = {**plain, "repetition_penalty": 1.3}
    a = client.rollout(prompts, n=1, sampling_params=penalised, next_prompts=prompts)
    b = client.rollout(prompts, n=1, sampling_params=penalised)  # pre-generated with it
    c = client.rollout(prompts, n=1, sampling_params=plain)
    assert a.output_ids() == b.output_ids() != c.output_ids()


def test_explicit_seeds_reproduce_across_steps(client: BubbleSpecClient, task: Any) -> None:
    """Keyed sampling: same seeds, same responses, whatever drafts the second step had."""
    prompts = task.make_prompts(4, 202)
    seeds = [[1000 * i + j for j in range(2)] for i in range(4)]
    keyed = {**SAMPLING, "seed_mode": "keyed"}
    a = client.rollout(prompts, n=2, sampling_params=keyed, seeds=seeds)
    b = client.rollout(prompts, n=2, sampling_params=keyed, seeds=seeds)
    assert b.step == a.step + 1
    assert a.output_ids() == b.output_ids()


def test_schedule_keyed_tokens_do_not_depend_on_the_gateway_step(client: BubbleSpecClient,
                                                                  task: Any) -> None:
    """`run_grpo` passes its own seeds: the same schedule run twice, at different gateway
    steps, samples the same keyed tokens (what makes benchmark modes comparable)."""
    from bubblespec.train.schedule import run_grpo

    keyed = {"temperature": 1.0, "max_new_tokens": 48, "seed_mode": "keyed"}
    runs = [run_grpo(client, task, "", steps=2, prompts_per_step=2, n=2, sampling=keyed,
                     seed=5, train=False, timeline_settle_s=0.0, log=lambda _: None)
            for _ in range(2)]
    assert [r["service_step"] for r in runs[0]] != [r["service_step"] for r in runs[1]]
    assert ([r["output_ids_sha256"] for r in runs[0]]
            == [r["output_ids_sha256"] for r in runs[1]])


def test_handoff_steps_default_to_keyed_sampling(client: BubbleSpecClient, task: Any) -> None:
    """A step that hands prompts ahead, and the step that receives them, sample keyed when
    the request leaves seed_mode unset; a named seed mode and a step without hand-off keep
    theirs."""
    small = {"temperature": 1.0, "max_new_tokens": 16}
    a, b = task.make_prompts(2, 303), task.make_prompts(2, 304)
    assert client.rollout(a, n=1, sampling_params=small, next_prompts=b).seed_mode == "keyed"
    assert client.rollout(b, n=1, sampling_params=small).seed_mode == "keyed"
    assert client.rollout(a, n=1, sampling_params=small).seed_mode == "default"
    named = {**small, "seed_mode": "default"}
    assert client.rollout(a, n=1, sampling_params=named, next_prompts=b).seed_mode == "default"


def test_prompts_handed_two_steps_ahead_feed_both_steps(client: BubbleSpecClient,
                                                        cluster: LocalCluster,
                                                        task: Any) -> None:
    """`next_prompts` as the next two steps' batches: the bubble of one step drafts both, so
    the step after next fetches drafts although the step between handed nothing ahead; the
    keyed tokens are those of keyed sampling with the same seeds without any drafts."""
    now = [task.make_prompt(3, 7, MAX_STEPS), task.make_prompt(5, 3, 1)]
    b1, b2 = [task.make_prompt(9, 4, 40)], [task.make_prompt(21, 2, 30)]
    keyed = {**SAMPLING, "seed_mode": "keyed"}
    # the training window: pre-generation goes on until the next rollout closes the step,
    # so how long this step's bubble is (the weights earlier tests pushed) does not matter
    a = client.rollout(now, n=1, sampling_params=keyed, seeds=[[11], [12]],
                       next_prompts=[b1, b2], next_seeds=[[[13]], [[14]]],
                       pregen_window="training")
    deadline = time.monotonic() + 120
    while not complete_draft(cluster, a.step + 2, list(b2[0].input_ids)):
        assert time.monotonic() < deadline, "step + 2's draft was never pre-generated"
        time.sleep(0.25)
    r1 = client.rollout(b1, n=1, sampling_params=keyed, seeds=[[13]])
    r2 = client.rollout(b2, n=1, sampling_params=keyed, seeds=[[14]])
    assert (r1.step, r2.step) == (a.step + 1, a.step + 2)
    assert r2.counters.drafts_fetched_tokens > 0, r2.counters
    again = client.rollout(b2, n=1, sampling_params=keyed, seeds=[[14]], pregen=False)
    assert again.output_ids() == r2.output_ids()


def test_pregen_in_the_bubble_feeds_the_next_step(client: BubbleSpecClient, cluster: LocalCluster,
                                                  task: Any) -> None:
    # one long and one short prompt: the short one's rank has a bubble to pre-generate in
    now = [task.make_prompt(3, 7, MAX_STEPS), task.make_prompt(5, 3, 1)]
    nxt = [task.make_prompt(9, 4, 40), task.make_prompt(21, 2, 30)]
    # n=1: the gateway splits a long prompt's samples over ranks, which would leave no bubble
    # vLLM's sampler named: under the hand-off default (keyed) the tokens are fixed by the
    # run seed, and with this one the faster rank did no pre-generation (cause not yet
    # read from the timeline); this test checks the bubble's mechanics, not the sampler
    plain = {**SAMPLING, "seed_mode": "default"}
    a = client.rollout(now, n=1, sampling_params=plain, next_prompts=nxt)
    assert {r.rank_id for r in a.ranks if r.num_prompts} == {"r0", "r1"}
    peer_before = _rank_counter(cluster, "bubblespec_drafts_peer_tokens_total")
    b = client.rollout(nxt, n=1, sampling_params=plain)
    assert b.step == a.step + 1
    assert b.counters.drafts_fetched_tokens > 0, b.counters
    # every fetched draft's bytes came from the rank that pushed it, none through the daemon
    assert (_rank_counter(cluster, "bubblespec_drafts_peer_tokens_total") - peer_before
            == b.counters.drafts_fetched_tokens)
    print("pre-gen feed:", b.counters)
    for s in (s for p in b.prompts for s in p.samples):  # the ranks report divergence
        assert s.num_recouplings is not None and s.num_accepted_after_divergence is not None
        assert s.first_divergence is None or 0 <= s.first_divergence < len(s.output_ids)
        assert (s.draft_ran_out is None) == (s.first_divergence is None)
        assert s.num_accepted_after_divergence <= s.num_accepted_tokens
    time.sleep(0.5)
    rep = client.step_timeline(a.step)
    assert rep.complete and {r.rank_id for r in rep.ranks} == {"r0", "r1"}
    assert rep.rollout is not None and rep.rollout["step"] == a.step
    # the rank done first is the one with a bubble after its shard. Not the one with the
    # least decode time: a rank whose shard starts late (its engine still busy) decodes
    # briefly and is done last, and its "bubble" (wall - busy) lies before its shard
    assert all(r.done_s is not None for r in rep.ranks), rep.ranks
    first = min(rep.ranks, key=lambda r: r.done_s)
    assert first.bubble_s > 0 and 0 < first.bubble_fraction <= 1, rep.ranks
    assert first.pregen_s > 0 and first.pregen_tokens > 0, rep.ranks
    assert rep.pregen_tokens == sum(r.pregen_tokens for r in rep.ranks)


def _rank_counter(cluster: LocalCluster, name: str) -> float:
    total = 0.0
    for url in cluster.rank_urls.values():
        for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def test_keyed_drafts_get_margin_branches(client: BubbleSpecClient, cluster: LocalCluster,
                                          task: Any) -> None:
    now = [task.make_prompt(3, 7, MAX_STEPS), task.make_prompt(5, 3, 1)]
    nxt = [task.make_prompt(9, 4, 3), task.make_prompt(21, 2, 2)]  # short: drafts complete
    keyed = {**SAMPLING, "seed_mode": "keyed"}
    before = _rank_counter(cluster, "bubblespec_pregen_branches_total")
    # the training window: pre-generation goes on after the step until the next one, so the
    # branches are decoded however short this step's bubble is (a drafted slow prompt, a
    # loaded machine); the ranks count them when their pre-generation runs out of tasks
    a = client.rollout(now, n=1, sampling_params=keyed, seeds=[[11], [12]],
                       next_prompts=nxt, next_seeds=[[13], [14]], pregen_window="training")
    deadline = time.monotonic() + 120
    while _rank_counter(cluster, "bubblespec_pregen_branches_total") <= before:
        assert time.monotonic() < deadline, "no margin branch decoded in the training window"
        time.sleep(0.5)
    b = client.rollout(nxt, n=1, sampling_params=keyed, seeds=[[13], [14]])
    assert b.step == a.step + 1 and b.counters.drafts_fetched_tokens > 0
    # the same weights: every response follows its draft, no branch is taken, and the
    # tokens are those of keyed sampling with the same seeds without pre-generation
    again = client.rollout(nxt, n=1, sampling_params=keyed, seeds=[[13], [14]], pregen=False)
    assert again.output_ids() == b.output_ids()


def test_ranks_health_and_metrics(client: BubbleSpecClient, cluster: LocalCluster) -> None:
    ranks = {r.rank_id: r for r in client.ranks()}
    assert set(ranks) == {"r0", "r1"}
    assert all(r.ready and r.registered for r in ranks.values())
    assert client.health()["ranks_ready"] == 2
    text = httpx.get(cluster.gateway_url + "/metrics").text
    assert "bubblespec_gateway_rollout_duration_seconds_count" in text
    assert "bubblespec_gateway_pregen_fetched_tokens_total" in text
    assert "bubblespec_step_bubble_seconds_bucket" in text
    for url in cluster.rank_urls.values():  # each rank's draft index against its budget
        idx = httpx.get(url + "/v1/draft_index", timeout=10).raise_for_status().json()
        assert 0 <= idx["tokens"] <= idx["token_budget"] and idx["drafts_dropped"] >= 0, idx


def test_weight_update_fans_out(client: BubbleSpecClient, task: Any) -> None:
    model = engine_model_dir()
    assert model is not None
    before = {r.rank_id: r.weight_version for r in client.ranks()}
    w = client.update_weights(model)
    assert w.weight_version == max(v or 0 for v in before.values()) + 1
    assert w.ranks == {"r0": w.weight_version, "r1": w.weight_version}
    res = client.rollout(task.make_prompts(4, 303), n=1, sampling_params=SAMPLING)
    assert res.weight_versions == [w.weight_version]
    with pytest.raises(BubbleSpecError) as e:
        client.update_weights("/nonexistent/weights")
    assert e.value.status in (400, 422, 502)
    assert "r0" in e.value.detail or "r1" in e.value.detail


def test_rank_refusal_names_the_field(client: BubbleSpecClient, task: Any) -> None:
    with pytest.raises(BubbleSpecError) as e:
        client.rollout(task.make_prompts(2, 404), n=1,
                       sampling_params={"max_new_tokens": 5000})  # > the ranks' model length
    assert e.value.status == 400
    assert "max_new_tokens" in e.value.field


def test_engine_refusals_name_the_field_as_each_request_spells_it(
        client: BubbleSpecClient, cluster: LocalCluster, task: Any) -> None:
    rank = cluster.rank_urls["r0"]
    ok = list(task.make_prompts(1, 405)[0].input_ids)
    shard = {"step": 0, "requests": [{"index": 0, "input_ids": ok},
                                     {"index": 1, "input_ids": [*ok[:2], 10**6]}]}
    r = httpx.post(f"{rank}/v1/step_shard", json=shard, timeout=30)
    assert r.status_code == 400 and r.json()["field"] == "requests[1].input_ids[2]", r.text
    r = httpx.post(f"{rank}/generate", json={"input_ids": [ok, [*ok[:1], 10**6]]}, timeout=30)
    assert r.status_code == 400 and r.json()["field"] == "input_ids[1][1]", r.text
    with pytest.raises(BubbleSpecError) as e:  # the gateway names its own request's field
        client.rollout(task.make_prompts(2, 406), n=1, sampling_params={"max_new_tokens": 5000})
    assert e.value.field == "sampling_params.max_new_tokens"


def test_synchronizer_down_then_back(client: BubbleSpecClient, cluster: LocalCluster,
                                     task: Any) -> None:
    cluster.kill("sync")
    prompts = task.make_prompts(4, 505)
    res = client.rollout(prompts, n=2, sampling_params=SAMPLING, next_prompts=prompts)
    check_result(res, prompts, 2)
    assert any("synchronizer" in w for w in res.warnings), res.warnings
    cluster.restart("sync")
    deadline = time.monotonic() + 30
    while not all(r.registered for r in client.ranks()):  # ranks re-register on heartbeat
        assert time.monotonic() < deadline, client.ranks()
        time.sleep(0.5)
    res = client.rollout(prompts, n=2, sampling_params=SAMPLING)
    assert res.warnings == []
    check_result(res, prompts, 2)


def _kill_rank_mid_step(client: BubbleSpecClient, cluster: LocalCluster, rank: str,
                        **kw: Any) -> dict:
    """SIGKILL `rank` while it provably owes its shard (see `fault_mid_step`)."""
    return fault_mid_step(client, cluster, rank, lambda: cluster.kill(rank), **kw)


def test_synchronizer_sigkilled_mid_step(client: BubbleSpecClient, cluster: LocalCluster,
                                        task: Any) -> None:
    """SIGKILL the synchronizer while both ranks decode: the step completes, every request
    is answered, greedy outputs equal a fault-free run; ranks re-register when it is back."""
    greedy = {"temperature": 0.0, "max_new_tokens": 600, "ignore_eos": True}
    prompts = [task.make_prompt(i, 3, MAX_STEPS - 30 + i) for i in range(4)]
    clean = client.rollout(prompts, n=1, sampling_params=greedy, next_prompts=prompts)
    out = fault_mid_step(client, cluster, "r0", lambda: cluster.kill("sync"), prompts=prompts,
                          n=1, sampling_params=greedy, next_prompts=prompts)
    assert "result" in out, out.get("error")
    res: RolloutResponse = out["result"]
    check_result(res, prompts, 1)
    assert res.output_ids() == clean.output_ids()
    cluster.restart("sync")
    deadline = time.monotonic() + 30
    while not all(r.registered for r in client.ranks()):
        assert time.monotonic() < deadline, client.ranks()
        time.sleep(0.5)
    again = client.rollout(prompts, n=1, sampling_params=greedy)
    assert again.warnings == [] and again.output_ids() == clean.output_ids()


def test_rank_killed_mid_step_is_rerun(client: BubbleSpecClient, cluster: LocalCluster,
                                       task: Any) -> None:
    prompts = [task.make_prompt(i, 3, MAX_STEPS - 20 + i) for i in range(6)]
    out = _kill_rank_mid_step(client, cluster, "r1", prompts=prompts, n=2,
                              sampling_params=LONG)
    assert "result" in out, out.get("error")
    res: RolloutResponse = out["result"]
    check_result(res, prompts, 2)
    assert res.reruns and all(r.from_rank == "r1" and r.to_rank == "r0" for r in res.reruns)
    assert any("r1" in w for w in res.warnings)
    by = {r.rank_id: r for r in res.ranks}
    assert by["r1"].failed and by["r1"].num_samples == 0
    assert by["r0"].num_samples == 12 and by["r0"].rerun
    assert {pr.rank_id for pr in res.prompts} == {"r0"}


def test_last_rank_lost_is_503_naming_it(client: BubbleSpecClient, cluster: LocalCluster,
                                         task: Any) -> None:
    prompts = [task.make_prompt(i, 3, MAX_STEPS) for i in range(4)]
    out = _kill_rank_mid_step(client, cluster, "r0", prompts=prompts, n=2,
                              sampling_params=LONG)
    err = out.get("error")
    assert isinstance(err, BubbleSpecUnavailable), out
    assert err.status == 503 and "r0" in err.detail


def test_logs_were_written(cluster: LocalCluster) -> None:
    for name in ("sync", "r0", "r1", "gateway"):
        assert Path(cluster.children[name].log_path).stat().st_size > 0
