"""A real Prometheus (Debian's `prometheus` package, installed by the test setup when
missing) scrapes a `bubblespec up` cluster (LocalCluster: a synchronizer, two vLLM ranks on
the embedded model, the gateway) on loopback while rollout steps run. Through Prometheus'
HTTP API: every target is up, the bubble, pre-generation and draft-acceptance series exist
with plausible values, the shipped alert/recording rules load and evaluate, and the Grafana
dashboard's queries run (the key panels with data). One step runs through the SGLang API:
each sample's record (`SampleMeta`), counted once by the engine, reaches the rollout and
SGLang answers, the step's counters and the gateway's and ranks' series unchanged."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bubblespec.client import BubbleSpecClient
from bubblespec.cluster import LocalCluster, free_ports
from bubblespec.protocol.sample import SampleMeta, SampleTotals
from tests.cluster.helpers import local_cluster
from tests.deploy.helpers import DEPLOY, ensure_tool

pytestmark = [pytest.mark.engine, pytest.mark.slow]  # CI time (docs/results.md, run 17): make test-slow

# plain sampling, named: hand-off steps would sample keyed by default, and keyed responses
# under unchanged weights follow their drafts, diverging only where a draft was cut short
SAMPLING = {"temperature": 1.0, "max_new_tokens": 400, "seed_mode": "default"}
NUM_SPECULATIVE_TOKENS = 8  # the rank default
MACROS = {"$__rate_interval": "1m", "$__range": "10m", "$__interval": "5s", "$rank": ".*"}


@pytest.fixture(scope="module")
def prometheus_bin() -> str:
    binary = ensure_tool("prometheus", "prometheus")
    if binary is None:
        pytest.skip("prometheus not installed and apt-get not usable (needs root and Debian's "
                    "package index): `apt-get install -y prometheus`")
    return binary


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, prometheus_bin: str
            ) -> Iterator[LocalCluster]:
    yield from local_cluster(tmp_path_factory)


def hostport(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0]


@contextlib.contextmanager
def run_prometheus(binary: str, tmp: Path, cluster: LocalCluster) -> Iterator[str]:
    """Prometheus on loopback scraping every process of `cluster` each second, with the
    shipped alert rules; yields its base URL."""
    (port,) = free_ports(1)
    rules = tmp / "alerts.yml"
    rules.write_text((DEPLOY / "prometheus" / "alerts.yml").read_text())
    addr = cluster.addresses()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": "bubblespec-synchronizer",
             "static_configs": [{"targets": [hostport(addr["sync_metrics"])]}]},
            {"job_name": "bubblespec-rank",
             "static_configs": [{"targets": [hostport(u) for u in cluster.rank_urls.values()]}]},
            {"job_name": "bubblespec-gateway",
             "static_configs": [{"targets": [hostport(cluster.gateway_url)]}]},
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/-/ready", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "prometheus not ready after 60 s"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def query(prom: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.get(prom + "/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    return body["data"]["result"]


def values(prom: str, expr: str, by: str | None = None) -> dict[str, float]:
    """{label value (or "")} -> float of an instant vector."""
    return {(s["metric"].get(by, "") if by else ""): float(s["value"][1])
            for s in query(prom, expr)}


def scalar(prom: str, expr: str) -> float:
    v = values(prom, expr)
    assert len(v) == 1, (expr, v)
    return next(iter(v.values()))


def wait_until(what: str, check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        out = check()
        if out:
            return out
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def make_batches(steps: int) -> list[list[Any]]:
    """The prompts of `steps` steps and of the one after: one long and one short prompt (so
    one rank has a bubble) and one in between."""
    from bubblespec.tasks import default_task

    task = default_task()
    return [[task.make_prompt(3 + i, 7, 120 - 10 * i), task.make_prompt(5 + i, 3, 2),
             task.make_prompt(11 + i, 4, 20)] for i in range(steps + 1)]


def run_steps(cluster: LocalCluster, steps: int = 4) -> list[Any]:
    """Rollout steps, each pre-generating the next step's prompts in its bubble."""
    batches = make_batches(steps)
    out = []
    with BubbleSpecClient(cluster.gateway_url, timeout_s=600) as client:
        for i in range(steps):
            out.append(client.rollout(batches[i], n=2, sampling_params=SAMPLING,
                                      next_prompts=batches[i + 1]))
    return out


def sglang_step(cluster: LocalCluster, prompts: list[Any], n: int = 2) -> list[dict[str, Any]]:
    """One step through the SGLang API, as slime sends it: one /generate per sample, all at
    once (so they run as one step), with the rollout steps' sampling."""
    sp = {"temperature": SAMPLING["temperature"], "max_new_tokens": SAMPLING["max_new_tokens"],
          "seed_mode": SAMPLING["seed_mode"]}

    async def run() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=cluster.gateway_url, timeout=600) as http:
            async def one(ids: list[int]) -> dict[str, Any]:
                r = await http.post("/generate", json={"input_ids": ids, "sampling_params": sp})
                assert r.status_code == 200, r.text
                return r.json()

            return list(await asyncio.gather(*(one(list(p.input_ids)) for p in prompts
                                               for _ in range(n))))

    return asyncio.run(run())


#: Per-step sums of the samples' records (`SampleTotals`) and the gateway metric of each.
EXPORTED = {
    "completion_tokens": "bubblespec_gateway_completion_tokens_total",
    "num_drafts": "bubblespec_gateway_spec_decode_num_drafts_total",
    "num_draft_tokens": "bubblespec_gateway_spec_decode_num_draft_tokens_total",
    "num_accepted_tokens": "bubblespec_gateway_spec_decode_num_accepted_tokens_total",
    "num_accepted_pregen_tokens": "bubblespec_gateway_pregen_accepted_tokens_total",
    "responses_diverged": "bubblespec_gateway_pregen_diverged_responses_total",
    "responses_draft_ran_out": "bubblespec_gateway_pregen_draft_ran_out_responses_total",
    "num_accepted_after_divergence":
        "bubblespec_gateway_pregen_accepted_after_divergence_tokens_total",
    "num_recouplings": "bubblespec_gateway_pregen_recouplings_total",
}
#: The same sums as the ranks count them, from the engine's results directly.
RANK_COUNTED = {
    "completion_tokens": "bubblespec_generation_tokens_total",
    "request_decode_steps": "bubblespec_decode_steps_total",
    "num_drafts": "bubblespec_spec_decode_num_drafts_total",
    "num_draft_tokens": "bubblespec_spec_decode_num_draft_tokens_total",
    "num_accepted_tokens": "bubblespec_spec_decode_num_accepted_tokens_total",
}


def test_prometheus_sees_bubbles_pregen_and_acceptance(
        prometheus_bin: str, cluster: LocalCluster, tmp_path: Path) -> None:
    with run_prometheus(prometheus_bin, tmp_path, cluster) as prom:
        wait_until("all 4 targets up", lambda: sorted(
            values(prom, 'up{job=~"bubblespec-.*"}', by="job").values()) == [1.0] * 3
            and len(query(prom, 'up{job=~"bubblespec-.*"}')) == 4)
        results = run_steps(cluster, steps=4)
        assert [r.step for r in results] == list(range(results[0].step, results[0].step + 4))
        # the step after: the prompts the last rollout pre-generated, through the SGLang API
        answers = sglang_step(cluster, make_batches(4)[4])
        num_samples = sum(len(p.samples) for r in results for p in r.prompts) + len(answers)
        wait_until("every sample counted", lambda: values(
            prom, "bubblespec_gateway_rollout_samples_total") == {"": num_samples})
        # the gateway observes a step's bubble figures once the next step has started
        wait_until("bubble histograms for both ranks", lambda: len(values(
            prom, "bubblespec_step_bubble_seconds_count >= 3", by="rank")) == 2)
        time.sleep(2.5)  # a couple more scrapes and rule evaluations

        # ---- targets: every process up
        ups = query(prom, 'up{job=~"bubblespec-.*"}')
        assert len(ups) == 4 and all(s["value"][1] == "1" for s in ups), ups

        # ---- bubble: per rank and step, within the step's wall time
        bubble = values(prom, "bubblespec_step_bubble_seconds_sum", by="rank")
        count = values(prom, "bubblespec_step_bubble_seconds_count", by="rank")
        assert set(bubble) == {"r0", "r1"} and all(c >= 3 for c in count.values()), count
        steps_wall = scalar(prom, "sum(bubblespec_step_duration_seconds_sum)")
        assert steps_wall > 0
        assert sum(bubble.values()) > 0, "one rank waited for the other"
        assert all(0 <= b <= steps_wall + 1.0 for b in bubble.values()), (bubble, steps_wall)
        frac = scalar(prom, "sum(bubblespec_step_bubble_fraction_sum)"
                            " / sum(bubblespec_step_bubble_fraction_count)")
        assert 0 < frac <= 1, frac
        rank_bubble = values(prom, "bubblespec_bubble_seconds_total", by="rank")
        assert set(rank_bubble) == {"r0", "r1"} and sum(rank_bubble.values()) > 0

        # ---- pre-generation: tokens made in the bubble, time inside the bubble
        pregen_tokens = values(prom, "bubblespec_pregen_tokens_total", by="rank")
        assert sum(pregen_tokens.values()) > 0, pregen_tokens
        assert scalar(prom, "sum(bubblespec_step_pregen_tokens_total)") > 0
        pregen_s = scalar(prom, "sum(bubblespec_step_pregen_seconds_sum)")
        assert 0 < pregen_s <= sum(bubble.values()) + 1e-6, (pregen_s, bubble)
        assert scalar(prom, "sum(bubblespec_pregen_pushed_tokens_total)") > 0
        assert scalar(prom, "sum(bubblespec_gateway_pregen_fetched_tokens_total)") > 0
        # plain sampling leaves its pre-generated drafts at once: divergences are counted
        diverged = scalar(prom, "sum(bubblespec_gateway_pregen_diverged_responses_total)")
        assert diverged > 0
        assert 0 <= scalar(prom, "sum(bubblespec_gateway_pregen_draft_ran_out_responses_total)"
                           ) <= diverged
        assert (scalar(prom, "sum(bubblespec_gateway_pregen_accepted_after_divergence_tokens"
                             "_total)")
                <= scalar(prom, "sum(bubblespec_gateway_spec_decode_num_accepted_tokens_total)"))

        # ---- one record per sample: what the engine counted for each sample reaches the
        # rollout answers, the step's counters, the SGLang answers and Prometheus unchanged
        for r in results:
            samples = [s for p in r.prompts for s in p.samples]
            assert r.counters.model_dump(include=set(SampleTotals.model_fields)) == \
                SampleTotals.sums(samples)
            assert all(s.completion_tokens == len(s.output_ids) for s in samples)
        records = [s.meta for r in results for p in r.prompts for s in p.samples]
        for a in answers:
            assert set(a["meta_info"]["bubblespec"]) == {"step", *SampleMeta.model_fields}
            records.append(SampleMeta.model_validate(a["meta_info"]["bubblespec"]))
            assert records[-1].completion_tokens == len(a["output_ids"])
        totals = SampleTotals.sums(records)
        assert totals["responses_diverged"] > 0, totals
        assert {k: scalar(prom, f"sum({m})") for k, m in EXPORTED.items()} == \
            {k: totals[k] for k in EXPORTED}
        assert {k: scalar(prom, f"sum({m})") for k, m in RANK_COUNTED.items()} == \
            {k: totals[k] for k in RANK_COUNTED}

        # ---- speculative decoding: vLLM's formulas, in range
        drafted = scalar(prom, "sum(bubblespec_spec_decode_num_draft_tokens_total)")
        accepted = scalar(prom, "sum(bubblespec_spec_decode_num_accepted_tokens_total)")
        drafts = scalar(prom, "sum(bubblespec_spec_decode_num_drafts_total)")
        assert drafted > 0 and drafts > 0 and 0 <= accepted <= drafted
        rate = scalar(prom, "sum(rate(bubblespec_spec_decode_num_accepted_tokens_total[1m]))"
                            " / sum(rate(bubblespec_spec_decode_num_draft_tokens_total[1m]))")
        assert 0 < rate <= 1, rate
        mal = scalar(prom, "1 + sum(rate(bubblespec_spec_decode_num_accepted_tokens_total[1m]))"
                           " / sum(rate(bubblespec_spec_decode_num_drafts_total[1m]))")
        assert 1 < mal <= 1 + NUM_SPECULATIVE_TOKENS, mal
        tpf = scalar(prom, "sum(bubblespec_generation_tokens_total)"
                           " / sum(bubblespec_decode_steps_total)")
        assert tpf >= 1, tpf
        print(f"\nbubble {bubble} s, fraction {frac:.2f}, pre-gen {pregen_s:.2f} s / "
              f"{sum(pregen_tokens.values()):.0f} tokens, acceptance {rate:.3f}, mean accepted "
              f"length {mal:.2f}, tokens/forward {tpf:.2f}")

        # ---- the shipped rules load and evaluate; no outage alert on a healthy cluster
        groups = httpx.get(prom + "/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert len(rules) >= 8 and all(r["health"] == "ok" for r in rules), \
            [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
        assert 0 < scalar(prom, "bubblespec:spec_decode_acceptance_rate:rate5m") <= 1
        assert scalar(prom, "bubblespec:spec_decode_mean_accepted_length:rate5m") > 1
        alerts = {s["metric"]["alertname"] for s in query(prom, "ALERTS")}
        assert not alerts & {"BubblespecRankDown", "BubblespecSynchronizerDown",
                             "BubblespecGatewayDown", "BubblespecRankLost"}, alerts

        # ---- every dashboard query runs; the panels this issue asks for have data
        dash = yaml.safe_load((DEPLOY / "grafana" / "bubblespec.json").read_text())
        empty = []
        for panel in dash["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for k, v in MACROS.items():
                    expr = expr.replace(k, v)
                if not query(prom, expr):
                    empty.append((panel["title"], target.get("legendFormat")))
        must = {"Busy time per step", "Bubble time per step", "Pre-gen time per step",
                "Bubble share recovered", "Pre-generated tokens", "Draft acceptance rate",
                "Mean accepted length", "Draft store size", "Step duration",
                "Request latency p95", "Tokens per forward pass", "Ranks by state"}
        assert not {t for t, _ in empty} & must, empty
