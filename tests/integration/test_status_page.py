"""The status page of a real cluster in headless Chromium (Debian's `chromium`, installed by
the test setup when missing), loaded while a rollout step runs: every rank shows in the rank
table and in the running step's timeline. The screenshot is kept in out/ (gitignored).

The page is the gateway's `/` route when the gateway serves it; otherwise (status page not
wired into `bubblespec gateway` yet) the same gateway app with `install_status_page` runs in
this process against the cluster's synchronizer and ranks, and the steps go through it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpx
import pytest

from bubblespec.client import BubbleSpecClient
from bubblespec.cluster import LocalCluster
from tests.cluster.helpers import local_cluster
from tests.deploy.browser import OUT, Dom, capture, chromium
from tests.serving import serve_app

pytestmark = [pytest.mark.engine, pytest.mark.slow]  # CI time (docs/results.md, run 17): make test-slow

SAMPLING = {"temperature": 1.0, "max_new_tokens": 600}


@pytest.fixture(scope="module")
def browser() -> str:
    binary = chromium()
    if binary is None:
        pytest.skip("chromium not installed and apt-get not usable (needs root and Debian's "
                    "package index): `apt-get install -y chromium`")
    return binary


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, browser: str) -> Iterator[LocalCluster]:
    yield from local_cluster(tmp_path_factory)


def serves_status_page(url: str) -> bool:
    try:
        r = httpx.get(url + "/", timeout=5)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and 'id="chart"' in r.text


@pytest.fixture(scope="module")
def gateway_url(cluster: LocalCluster) -> Iterator[str]:
    if serves_status_page(cluster.gateway_url):
        yield cluster.gateway_url
        return
    from bubblespec.gateway.config import GatewayConfig
    from bubblespec.gateway.server import create_app
    from bubblespec.gateway.status_page import install_status_page

    ranks = [u.split("://", 1)[1] for u in cluster.rank_urls.values()]
    cfg = GatewayConfig(sync_address=cluster.sync_address, ranks=ranks,
                        tokenizer=cluster.model or "")
    app = create_app(cfg)
    install_status_page(app, refresh_s=1.0)
    with serve_app(app) as url:
        yield url


def wait_for(what: str, check: Any, timeout_s: float = 60.0, period_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            out = check()
        except (httpx.HTTPError, ValueError, KeyError):
            out = None
        if out:
            return out
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(period_s)


def shows_ranks(ranks: Iterable[str], steps: Iterable[int]) -> str:
    """JavaScript: the page refreshed, its rank table has every rank of `ranks` and its
    chart a row for each of them in every step of `steps`."""
    return f"""(() => {{
  const ranks = {json.dumps(sorted(ranks))}, steps = {json.dumps(sorted(steps))};
  const has = (selector) => new Set(Array.from(document.querySelectorAll(selector),
                                               (e) => e.dataset.rank));
  if (document.body.dataset.state !== "ready") return false;
  const table = has("tr[data-rank]");
  return ranks.every((r) => table.has(r)) && steps.every((s) => {{
    const drawn = has(`g.rank-row[data-step="${{s}}"]`);
    return ranks.every((r) => drawn.has(r));
  }});
}})()"""


def test_status_page_shows_every_rank_while_a_step_runs(browser: str, cluster: LocalCluster,
                                                        gateway_url: str) -> None:
    from bubblespec.tasks import default_task

    task = default_task()
    assert serves_status_page(gateway_url)
    # a long step (no drafts pre-generated for it) so that the page loads while it runs
    long_batch = [task.make_prompt(i, 3 + i % 5, 140) for i in range(12)]
    with BubbleSpecClient(gateway_url, timeout_s=600) as client:
        # a finished step first (with pre-generation in its bubble), so there is history
        first = client.rollout([task.make_prompt(3, 7, 100), task.make_prompt(5, 3, 2)], n=2,
                               sampling_params=SAMPLING,
                               next_prompts=[task.make_prompt(9, 4, 40)])
        out: dict[str, Any] = {}

        def run() -> None:
            out["result"] = client.rollout(long_batch, n=4, sampling_params=SAMPLING)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        running = first.step + 1
        wait_for("the step to be open and decoding", lambda: (
            (info := httpx.get(gateway_url + "/v1/ranks", timeout=5).json())["current_step"]
            == running and any(r["state"] == "decoding" for r in info["ranks"])))
        assert thread.is_alive(), "the step ended before the page was loaded"
        shot = OUT / "status_page_cluster.png"
        # the DOM as soon as the page shows what is checked below (real time: the page polls
        # the busy gateway, which virtual time could wait on forever); both cores are busy
        # with the step, so chromium's start and paint may be slow: a generous hard deadline
        t0 = time.monotonic()
        dom = Dom(capture(browser, gateway_url + "/", shot,
                          until=shows_ranks(cluster.rank_ids, (first.step, running)),
                          deadline_s=300))
        capture_s = time.monotonic() - t0
        still_running = thread.is_alive()
        thread.join(600)
    assert "result" in out, "the rollout did not finish"

    body = dom.body()
    assert body["data-state"] == "ready", body
    table = {a["data-rank"] for a in dom.find("tr") if "data-rank" in a}
    assert table == set(cluster.rank_ids), table
    rows = dom.with_class("g", "rank-row")
    for step in (first.step, running):
        drawn = {a["data-rank"] for a in rows if int(a["data-step"]) == step}
        assert drawn == set(cluster.rank_ids), (step, drawn)
    steps = {int(a["data-step"]): a["data-complete"] for a in dom.with_class("g", "step")}
    assert steps[first.step] == "true", steps
    if still_running:  # the DOM was taken while the step ran: it is drawn as running
        assert steps[running] == "false", steps
    done = [a for a in rows if int(a["data-step"]) == first.step]
    assert all(float(a["data-decode-s"]) > 0 for a in done)
    assert any(float(a["data-pregen-s"]) + float(a["data-idle-s"]) > 0 for a in done), \
        "the faster rank had a bubble in the first step"
    weights = [a for a in dom.elements if a[0] == "td"
               and "weight-version" in a[1].get("class", "")]
    assert len(weights) == len(cluster.rank_ids)
    assert shot.stat().st_size > 5000
    print(f"\nstatus page: {shot} (step {running} running during the dump: {still_running}; "
          f"captured in {capture_s:.1f} s)")
