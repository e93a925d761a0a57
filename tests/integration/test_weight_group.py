"""Process-group weight pushes on a real 2-rank LocalCluster: a torch trainer (gloo, rank 0
of its own named group) pushes the policy through the gateway's SGLang routes (slime's
sequence) and through the Python API (`bubblespec.client.weights`); the ranks then sample
exactly what a disk reload of the same weights samples (keyed ids). Drills: a wrong name,
shape or dtype, a version going back, an incomplete push and a trainer that dies
mid-broadcast each leave the old weights serving with the error named, and the group can be
opened again. The same for tensors a colocated trainer hands over in shared memory
(`/update_weights_from_tensor`: the Python API, and SGLang's flattened buckets)."""

from __future__ import annotations

import base64
import io
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from bubblespec.client import BubbleSpecClient
from bubblespec.client.weights import (
    WeightGroup,
    WeightPushError,
    free_port,
    push_tensors,
    serialize_tensors,
)
from bubblespec.cluster import LocalCluster
from tests.cluster.helpers import local_cluster
from tests.sglang_shapes import SGLANG_TRAINER_PREAMBLE

pytestmark = pytest.mark.engine

KEYED = {"temperature": 1.0, "max_new_tokens": 40, "seed_mode": "keyed"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from local_cluster(tmp_path_factory)


@pytest.fixture(scope="module")
def weights(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
            ) -> dict[str, Any]:
    """The model's tensors, a perturbed copy of them, and that copy as a checkpoint dir."""
    src = Path(cluster.model)
    base = {}
    for f in sorted(src.glob("*.safetensors")):
        base.update(load_file(str(f)))
    gen = torch.Generator().manual_seed(5)
    new = {k: (v + 0.05 * torch.randn(v.shape, generator=gen)).to(v.dtype) if v.ndim == 2
           else v.clone() for k, v in base.items()}
    d = tmp_path_factory.mktemp("pushed")
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            (d / f.name).write_bytes(f.read_bytes())
    save_file(new, str(d / "model.safetensors"), metadata={"format": "pt"})
    return {"base": base, "new": new, "dir": str(d)}


def keyed_ids(cluster: LocalCluster, task: Any) -> tuple[list[list[int]], int]:
    prompts = task.make_prompts(3, 41)
    with BubbleSpecClient(cluster.gateway_url, timeout_s=300) as c:
        r = c.rollout(prompts, n=2, sampling_params=KEYED, seeds=[[1, 2], [3, 4], [5, 6]],
                      pregen=False)
    versions = {s.weight_version for p in r.prompts for s in p.samples}
    assert len(versions) == 1, versions
    return r.output_ids(), versions.pop()


@pytest.fixture(scope="module")
def task() -> Any:
    from bubblespec.tasks import default_task

    return default_task()


def version(cluster: LocalCluster) -> int:
    return int(httpx.get(cluster.gateway_url + "/get_weight_version", timeout=30)
               .json()["weight_version"])


def test_a_push_samples_what_a_disk_reload_of_the_same_weights_samples(
        cluster: LocalCluster, weights: dict[str, Any], task: Any) -> None:
    before, v0 = keyed_ids(cluster, task)
    with WeightGroup(cluster.gateway_url, group_name="py-api", timeout_s=60,
                     bucket_bytes=2**20) as group:  # several buckets
        assert sorted(group.ranks) == ["r0", "r1"]
        t0 = time.perf_counter()
        assert group.push(weights["new"].items(), version=v0 + 1) == v0 + 1
        t_push = time.perf_counter() - t0
    pushed, v = keyed_ids(cluster, task)
    assert v == v0 + 1 and pushed != before
    with BubbleSpecClient(cluster.gateway_url, timeout_s=300) as c:
        t0 = time.perf_counter()
        c.update_weights(weights["dir"], version=v0 + 2)
        t_disk = time.perf_counter() - t0
    print(f"push to 2 ranks, embedded model: gloo {t_push:.2f} s, disk reload {t_disk:.2f} s "
          "(the checkpoint already written; not a benchmark)")
    from_disk, v = keyed_ids(cluster, task)
    assert v == v0 + 2
    assert pushed == from_disk  # the push is the checkpoint, token for token
    with WeightGroup(cluster.gateway_url, group_name="py-api", timeout_s=60) as group:
        assert group.push(weights["base"].items(), version=v0 + 3) == v0 + 3
    again, _ = keyed_ids(cluster, task)
    assert again == before


def test_slimes_sequence_through_the_sglang_routes(cluster: LocalCluster,
                                                   weights: dict[str, Any], task: Any) -> None:
    """slime: init the group (fired first), pause, flush, per bucket the call then the
    broadcasts, continue_generation as the end of the update, destroy."""
    before, v0 = keyed_ids(cluster, task)
    group = WeightGroup(cluster.gateway_url, group_name="slime-pp_0", timeout_s=60)
    group.open(num_ranks=2)
    url = cluster.gateway_url
    with httpx.Client(base_url=url, timeout=120) as http:
        assert http.post("/pause_generation", json={}).status_code == 200
        assert http.get("/flush_cache").status_code == 200
        items = list(weights["new"].items())
        half = len(items) // 2
        for bucket in (items[:half], items[half:]):
            body = {"names": [n for n, _ in bucket],
                    "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                    "shapes": [list(t.shape) for _, t in bucket], "group_name": "slime-pp_0",
                    "flush_cache": False, "weight_version": str(v0 + 1)}
            done = _broadcast_while(group, http, "/update_weights_from_distributed", body,
                                    [t for _, t in bucket])
            assert done.status_code == 200 and done.json()["success"] is True, done.text
            # a half-updated model advertises no new version
            assert version(cluster) == v0
        r = http.post("/continue_generation", json={})
        assert r.status_code == 200 and r.json()["weight_version"] == str(v0 + 1), r.text
        assert version(cluster) == v0 + 1
    group.close()
    pushed, v = keyed_ids(cluster, task)
    assert v == v0 + 1 and pushed != before
    with WeightGroup(cluster.gateway_url, group_name="slime-pp_0", timeout_s=60) as back:
        back.push(weights["base"].items(), version=v0 + 2)  # the module's other tests start there


def test_one_group_per_pipeline_stage_stage_one_push(cluster: LocalCluster,
                                                     weights: dict[str, Any],
                                                     task: Any) -> None:
    """slime with a pipeline-parallel trainer: one group per stage (`slime-pp_0`,
    `slime-pp_1`), both open at once, each stage broadcasting its half of the tensors
    concurrently; `/continue_generation` loads the one push, which samples what a disk
    reload of the same weights samples."""
    import threading

    _, v0 = keyed_ids(cluster, task)
    url = cluster.gateway_url
    items = list(weights["new"].items())
    halves = {"slime-pp_0": items[: len(items) // 2], "slime-pp_1": items[len(items) // 2:]}
    groups = {name: WeightGroup(url, group_name=name, timeout_s=120) for name in halves}
    for g in groups.values():
        g.open(num_ranks=2)  # the second does not close the first
    answers: dict[str, httpx.Response] = {}

    def stage(name: str) -> None:
        with httpx.Client(base_url=url, timeout=300) as http:
            bucket = halves[name]
            body = {"names": [n for n, _ in bucket],
                    "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                    "shapes": [list(t.shape) for _, t in bucket], "group_name": name,
                    "flush_cache": False, "weight_version": str(v0 + 1)}
            answers[name] = _broadcast_while(groups[name], http,
                                             "/update_weights_from_distributed", body,
                                             [t for _, t in bucket])

    with httpx.Client(base_url=url, timeout=300) as http:
        assert http.post("/pause_generation", json={"mode": "in_place"}).status_code == 200
        threads = [threading.Thread(target=stage, args=(n,)) for n in halves]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        for name, r in answers.items():
            assert r.status_code == 200 and r.json()["success"] is True, (name, r.text)
        assert version(cluster) == v0  # staged in two groups, loaded by neither alone
        r = http.post("/continue_generation", json={})
        assert r.status_code == 200 and r.json()["weight_version"] == str(v0 + 1), r.text
    for g in groups.values():
        g.close()
    pushed, v = keyed_ids(cluster, task)
    assert v == v0 + 1
    with BubbleSpecClient(url, timeout_s=300) as c:
        c.update_weights(weights["dir"], version=v0 + 2)
    assert keyed_ids(cluster, task) == (pushed, v0 + 2)
    push_tensors(url, weights["base"].items(), version=v0 + 3)  # where the next tests start


def _broadcast_while(group: WeightGroup, http: httpx.Client, route: str,
                     body: dict[str, Any], tensors: list[torch.Tensor]) -> httpx.Response:
    """POST `body` on a thread while broadcasting `tensors` from rank 0 (slime's order)."""
    import threading

    out: dict[str, httpx.Response] = {}
    t = threading.Thread(target=lambda: out.update(r=http.post(route, json=body)))
    t.start()
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank = 0
    for x in tensors:
        group.group.broadcast([x.contiguous()], opts).wait()
    t.join(120)
    return out["r"]


def test_refused_pushes_leave_the_old_weights_serving(cluster: LocalCluster,
                                                      weights: dict[str, Any],
                                                      task: Any) -> None:
    before, v0 = keyed_ids(cluster, task)
    new = weights["new"]
    name, t = next((k, v) for k, v in new.items() if v.ndim == 2)
    bad_cases = {
        "names": [("model.no_such.weight", t)],
        "shapes": [(name, t[:-1])],
        "dtypes": [(name, t.to(torch.float64))],
    }
    nan = t.clone()
    nan[0, 0] = float("nan")
    with WeightGroup(cluster.gateway_url, group_name="drills", timeout_s=60) as group:
        for field, bucket in bad_cases.items():
            with pytest.raises(WeightPushError) as e:
                group.push(bucket, version=v0 + 1)
            assert (e.value.status, e.value.field) == (400, field), e.value  # SGLang's 400
        with pytest.raises(WeightPushError) as e:  # versions only go up
            group.push(new.items(), version=v0)
        assert (e.value.status, e.value.field) == (409, "weight_version"), e.value
        with pytest.raises(WeightPushError) as e:  # a push must cover the model
            group.push([(name, t)], version=v0 + 1)
        assert (e.value.status, e.value.field) == (400, "names"), e.value
        assert "not sent" in str(e.value)
        with pytest.raises(WeightPushError) as e:  # non-finite values are refused
            group.push([(name, nan)] + [(k, v) for k, v in new.items() if k != name],
                       version=v0 + 1)
        assert (e.value.status, e.value.field) == (400, "names"), e.value
        assert "non-finite" in str(e.value)
        after, v = keyed_ids(cluster, task)
        assert (after, v) == (before, v0)
        # the group stayed in step through every refusal: a good push goes through
        assert group.push(weights["base"].items(), version=v0 + 1) == v0 + 1
    assert keyed_ids(cluster, task) == (before, v0 + 1)


TRAINER_DIES = r"""
import os, sys, threading, httpx, torch
from safetensors.torch import load_file
from bubblespec.client.weights import WeightGroup
url, model, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
base = {}
for f in sorted(os.listdir(model)):
    if f.endswith(".safetensors"):
        base.update(load_file(os.path.join(model, f)))
items = list(base.items())
g = WeightGroup(url, group_name="dies", timeout_s=30, master_port=port)
g.open(num_ranks=2)
body = {"names": [n for n, _ in items], "shapes": [list(t.shape) for _, t in items],
        "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in items],
        "group_name": "dies", "weight_version": sys.argv[4]}
threading.Thread(target=lambda: httpx.post(url + "/update_weights_from_distributed",
                                           json=body, timeout=120), daemon=True).start()
opts = torch.distributed.BroadcastOptions()
opts.rootRank = 0
for _, t in items[: len(items) // 2]:
    g.group.broadcast([t.contiguous()], opts).wait()
print("half sent", flush=True)
os._exit(9)
"""


def test_a_trainer_that_dies_mid_broadcast_changes_nothing(cluster: LocalCluster,
                                                           task: Any) -> None:
    before, v0 = keyed_ids(cluster, task)
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    p = subprocess.run([sys.executable, "-c", TRAINER_DIES, cluster.gateway_url,
                        str(cluster.model), str(free_port()), str(v0 + 1)],
                       check=False, capture_output=True, text=True, timeout=180,
                       env=env)
    assert p.returncode == 9 and "half sent" in p.stdout, p.stderr[-2000:]
    # the ranks hear of the dead peer and close the group: the gateway forgets it
    deadline = time.monotonic() + 90
    while True:
        r = httpx.post(cluster.gateway_url + "/destroy_weights_update_group",
                       json={"group_name": "dies"}, timeout=60)
        if r.status_code == 404:
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(1.0)
    print(f"dead trainer noticed within {time.monotonic() - t0:.1f} s")
    assert keyed_ids(cluster, task) == (before, v0)
    # the same group name opens again and a push goes through
    with WeightGroup(cluster.gateway_url, group_name="dies", timeout_s=60) as group:
        base = {}
        for f in sorted(Path(cluster.model).glob("*.safetensors")):
            base.update(load_file(str(f)))
        assert group.push(base.items(), version=v0 + 1) == v0 + 1
    assert keyed_ids(cluster, task) == (before, v0 + 1)


def test_release_and_resume_around_a_push_keep_the_drafts(cluster: LocalCluster,
                                                          weights: dict[str, Any],
                                                          task: Any) -> None:
    """slime's colocated order: release, (train), resume weights, push, resume the rest.
    Pre-generation stops before the release, generation is refused while released (503,
    no hang), the drafts handed ahead survive it, and the step after serves the pushed
    weights with those drafts."""
    from tests.integration.drafts import complete_draft

    url = cluster.gateway_url
    now = task.make_prompts(2, 61)
    nxt = task.make_prompts(2, 62)
    with BubbleSpecClient(url, timeout_s=300) as c:
        v0 = max(r.weight_version or 0 for r in c.ranks())
        a = c.rollout(now, n=1, sampling_params=KEYED, next_prompts=nxt,
                      next_seeds=[[7], [8]], pregen_window="training")
    deadline = time.monotonic() + 120
    while not complete_draft(cluster, a.step + 1, nxt[0].input_ids):
        assert time.monotonic() < deadline, "the next step's draft was never pre-generated"
        time.sleep(0.25)
    with httpx.Client(base_url=url, timeout=120) as http:
        r = http.post("/release_memory_occupation", json={})
        assert r.status_code == 200 and r.json()["success"] is True, r.text
        assert set(r.json()["ranks"]) == {"r0", "r1"}
        for rank_url in cluster.rank_urls.values():
            assert httpx.get(rank_url + "/v1/state", timeout=10).json()["state"] == "released"
            h = httpx.get(rank_url + "/health_generate", timeout=10)
            assert h.status_code == 503 and h.json()["status"] == "released"
        g = http.post("/generate", json={"input_ids": list(now[0].input_ids),
                                         "sampling_params": {"max_new_tokens": 4}})
        assert g.status_code == 503 and "released" in g.text, g.text
        with WeightGroup(url, group_name="colocated", timeout_s=60) as group:
            with pytest.raises(WeightPushError) as e:  # the weights must be resident first
                group.push(weights["new"].items(), version=v0 + 1)
            assert (e.value.status, e.value.field) == (409, "engine"), e.value
        r = http.post("/resume_memory_occupation", json={"tags": ["weights"]})
        assert r.status_code == 200 and r.json()["ranks"]["r0"] == ["cuda_graph", "kv_cache"]
        with WeightGroup(url, group_name="colocated", timeout_s=60) as group:
            assert group.push(weights["new"].items(), version=v0 + 1) == v0 + 1
        r = http.post("/resume_memory_occupation", json={"tags": ["kv_cache", "cuda_graph"]})
        assert r.status_code == 200 and r.json()["ranks"]["r0"] == [], r.text
        assert http.post("/resume_memory_occupation", json={"tags": ["disk"]}).status_code == 400
    with BubbleSpecClient(url, timeout_s=300) as c:
        b = c.rollout(nxt, n=1, sampling_params=KEYED, seeds=[[7], [8]])
    assert b.step == a.step + 1 and b.counters.drafts_fetched_tokens > 0, b.counters
    assert {s.weight_version for p in b.prompts for s in p.samples} == {v0 + 1}


# --------------------------------------------------------------- tensors handed over
def test_handed_over_tensors_sample_what_a_disk_reload_samples(
        cluster: LocalCluster, weights: dict[str, Any], task: Any) -> None:
    """A colocated trainer (this process, on the ranks' host) hands the weights over in
    shared memory (`push_tensors`, SGLang's `/update_weights_from_tensor`), in several
    calls: the one that completes the model loads it on both ranks, and they sample what a
    disk reload of the same weights samples."""
    url = cluster.gateway_url
    _, v0 = keyed_ids(cluster, task)
    with BubbleSpecClient(url, timeout_s=300) as c:
        c.update_weights(weights["dir"], version=v0 + 1)
    from_disk, _ = keyed_ids(cluster, task)
    t0 = time.perf_counter()
    assert push_tensors(url, weights["base"].items(), version=v0 + 2,
                        bucket_bytes=2**20) == v0 + 2
    t_push = time.perf_counter() - t0
    base_ids, v = keyed_ids(cluster, task)
    assert v == v0 + 2 and base_ids != from_disk
    assert push_tensors(url, weights["new"].items()) == v0 + 3  # version: theirs + 1
    pushed, v = keyed_ids(cluster, task)
    assert v == v0 + 3 and pushed == from_disk  # the tensors are the checkpoint
    print(f"tensors handed to 2 ranks, embedded model, 1 MiB calls: {t_push:.2f} s "
          "(not a benchmark)")


SGLANG_COLOCATED = SGLANG_TRAINER_PREAMBLE + r"""
# a colocated trainer as SGLang's callers write one (slime's colocated update): pause,
# FlattenedTensorBucket's metadata class under SGLang's module path,
# MultiprocessingSerializer's text, one call per bucket, continue_generation
import httpx
from safetensors.torch import load_file
url, model_dir, version = sys.argv[1], sys.argv[2], sys.argv[3]
named = list(load_file(os.path.join(model_dir, "model.safetensors")).items())
half = len(named) // 2
http = httpx.Client(base_url=url, timeout=300)
assert http.post("/pause_generation", json={"mode": "in_place"}).status_code == 200
for i, bucket in enumerate((named[:half], named[half:])):
    flats, meta, at = [], [], 0
    for n, t in bucket:
        flats.append(t.flatten())
        meta.append(FlattenedTensorMetadata(n, t.shape, t.dtype, at, at + t.numel(), t.numel()))
        at += t.numel()
    flat = torch.cat(flats)  # kept until the ranks answer: its memory is what they map
    buf = io.BytesIO()
    ForkingPickler(buf).dump({"flattened_tensor": flat, "metadata": meta})
    r = http.post("/update_weights_from_tensor", json={
        "serialized_named_tensors": [base64.b64encode(buf.getvalue()).decode()],
        "load_format": "flattened_bucket", "flush_cache": i == 1,
        "weight_version": version})
    assert r.status_code == 200 and r.json()["success"], r.text
    print("call", i, "loaded", r.json()["loaded"], "served",
          http.get("/get_weight_version").json()["weight_version"], flush=True)
r = http.post("/continue_generation", json={})
assert r.status_code == 200, r.text
"""


def test_sglangs_colocated_sequence_with_flattened_buckets(
        cluster: LocalCluster, weights: dict[str, Any], task: Any, tmp_path: Path) -> None:
    """SGLang's request shape from a trainer process of its own: two flattened buckets
    between pause and continue; the first stages (the ranks still serve the old version),
    the second completes the model and loads it; the ranks sample what a disk reload of
    the same weights samples."""
    _, v0 = keyed_ids(cluster, task)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    out, err = tmp_path / "out", tmp_path / "err"
    try:  # to files, not pipes: torch's shared-memory manager outlives the trainer a while
        with out.open("w") as o, err.open("w") as e:
            p = subprocess.run([sys.executable, "-c", SGLANG_COLOCATED, cluster.gateway_url,
                                weights["dir"], str(v0 + 1)], check=False, stdout=o,
                               stderr=e, stdin=subprocess.DEVNULL, timeout=300, env=env)
    finally:
        httpx.post(cluster.gateway_url + "/continue_generation", json={}, timeout=120)
    assert p.returncode == 0, err.read_text()[-2000:]
    assert out.read_text().splitlines() == [f"call 0 loaded False served {v0}",
                                            f"call 1 loaded True served {v0 + 1}"]
    pushed, v = keyed_ids(cluster, task)
    assert v == v0 + 1
    with BubbleSpecClient(cluster.gateway_url, timeout_s=300) as c:
        c.update_weights(weights["dir"], version=v0 + 2)
    assert keyed_ids(cluster, task) == (pushed, v0 + 2)


def test_refused_tensors_leave_the_old_weights_serving(cluster: LocalCluster,
                                                       weights: dict[str, Any],
                                                       task: Any) -> None:
    url = cluster.gateway_url
    before, v0 = keyed_ids(cluster, task)
    new = weights["new"]
    name, t = next((k, v) for k, v in new.items() if v.ndim == 2)
    nan = t.clone()
    nan[0, 0] = float("nan")
    cases = [("names", [("model.no_such.weight", t)]), ("shapes", [(name, t[:-1])]),
             ("dtypes", [(name, t.to(torch.float64))]),
             ("serialized_named_tensors", [(name, nan)])]
    for field, bucket in cases:
        with pytest.raises(WeightPushError) as e:
            push_tensors(url, bucket, version=v0 + 1)
        assert (e.value.status, e.value.field) == (400, field), e.value  # SGLang's 400
    with pytest.raises(WeightPushError) as e:  # versions only go up
        push_tensors(url, new.items(), version=v0)
    assert (e.value.status, e.value.field) == (409, "weight_version"), e.value
    with pytest.raises(WeightPushError) as e:  # a push must cover the model
        push_tensors(url, [(name, t)], version=v0 + 1)
    assert (e.value.status, e.value.field) == (400, "names") and "not sent" in str(e.value)
    # a call refused after one that staged drops the whole push on every rank
    first = [(k, v) for k, v in new.items() if k != name]
    push = {"serialized_named_tensors": [serialize_tensors(first)], "weight_version": str(v0 + 1)}
    with httpx.Client(base_url=url, timeout=300) as http:
        r = http.post("/update_weights_from_tensor", json=push)
        assert r.status_code == 200 and r.json()["loaded"] is False, r.text
        bad = {**push, "serialized_named_tensors": [serialize_tensors([(name, t[:-1])])]}
        r = http.post("/update_weights_from_tensor", json=bad)
        assert r.status_code == 400 and r.json()["field"] == "shapes", r.text
        r = http.post("/v1/weights/commit", json={})
        assert r.status_code == 409 and r.json()["field"] == "weight_version", r.text
        # not tensors, or tensors another process cannot map: refused, named
        for payload, why in ((pickle.dumps([(name, os.getpid)]), "posix.getpid"),
                             (_fd_shared([(name, t)]), "file_system")):
            r = http.post("/update_weights_from_tensor", json={
                "serialized_named_tensors": [base64.b64encode(payload).decode()]})
            assert r.status_code == 400, r.text
            assert r.json()["field"] == "serialized_named_tensors" and why in r.text, r.text
    assert keyed_ids(cluster, task) == (before, v0)
    assert push_tensors(url, new.items(), version=v0 + 1) == v0 + 1


def _fd_shared(named: list[tuple[str, torch.Tensor]]) -> bytes:
    """A pickle of tensors shared by file descriptor (torch's default strategy)."""
    from multiprocessing.reduction import ForkingPickler

    buf = io.BytesIO()
    ForkingPickler(buf).dump([(n, x.clone()) for n, x in named])
    return buf.getvalue()
