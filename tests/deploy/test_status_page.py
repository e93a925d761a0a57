"""The gateway's status page against a fake gateway (no engines): served as one
self-contained page, and rendered by headless Chromium into a rank table and per-rank step
timelines that match the JSON routes. tests/integration/test_status_page.py does the same
against a real cluster while a step runs."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient

from bubblespec.gateway.bubbles import step_bubbles
from bubblespec.gateway.status_page import install_status_page, render_page
from bubblespec.protocol.domain import ShardAssignment, Span, SpanKind, StepTimeline
from tests.deploy.browser import OUT, Dom, capture, chromium
from tests.serving import serve_app

T0 = 1_700_000_000.0
EVIL = '<script>document.body.dataset.pwned="1"</script>'


def timeline(step: int, complete: bool = True) -> dict[str, Any]:
    t = StepTimeline(
        step=step, opened_unix_s=T0, stop_unix_s=T0 + 10 if complete else None,
        shards=[ShardAssignment("r0", 8), ShardAssignment("r1", 8), ShardAssignment("r2", 8)],
        spans={"r0": [Span(SpanKind.DECODE, T0, T0 + 4, 100),
                      Span(SpanKind.PREGEN, T0 + 4, T0 + 9, 300)],
               "r1": [Span(SpanKind.DECODE, T0, T0 + 10, 250)],
               "r2": [Span(SpanKind.DECODE, T0, T0 + 7, 180)]},
        done_unix_s={"r0": T0 + 4, "r1": T0 + 10, "r2": T0 + 7})
    return step_bubbles(t, now_unix_s=T0 + 6).as_dict()


def fake_gateway(broken: bool = False) -> FastAPI:
    app = FastAPI()
    ranks = [
        {"rank_id": "r0", "url": "http://127.0.0.1:1", "source": "sync", "registered": True,
         "sync_state": "pregen", "last_heartbeat_age_s": 0.4, "state": "pregen",
         "weight_version": 3, "step": 4, "ready": True, "error": ""},
        {"rank_id": "r1", "url": "http://127.0.0.1:2", "source": "sync", "registered": True,
         "sync_state": "decoding", "last_heartbeat_age_s": 0.2, "state": "decoding",
         "weight_version": 3, "step": 4, "ready": True, "error": ""},
        {"rank_id": "r2", "url": "http://127.0.0.1:3", "source": "static", "registered": False,
         "sync_state": "", "last_heartbeat_age_s": None, "state": "", "weight_version": None,
         "step": None, "ready": False, "error": EVIL},
    ]

    @app.get("/v1/ranks")
    async def v1_ranks() -> dict[str, Any]:
        if broken:
            raise HTTPException(500, "boom")
        return {"ranks": ranks, "ready": 2, "sync_ok": True, "sync_error": "",
                "current_step": 4, "last_step": 4}

    @app.get("/v1/steps/{step}")
    async def v1_step(step: int) -> dict[str, Any]:
        if step in (2, 3):
            return {"step": step, "timeline": timeline(step), "rollout": None, "warnings": []}
        if step == 4:
            return {"step": 4, "timeline": timeline(4, complete=False), "rollout": None,
                    "warnings": []}
        if step == 0:  # no synchronizer timeline: the gateway's own summary
            return {"step": 0, "timeline": None, "warnings": ["no timeline"], "rollout": {
                "step": 0, "wall_s": 5.0, "counters": {"num_draft_tokens": 10,
                                                       "num_accepted_tokens": 5},
                "ranks": [{"rank_id": "r0", "decode_seconds": 2.0, "num_samples": 4},
                          {"rank_id": "r1", "decode_seconds": 5.0, "num_samples": 4}]}}
        raise HTTPException(404, "step not found")

    install_status_page(app, refresh_s=1.0, steps=6)
    return app


def test_page_is_served_self_contained() -> None:
    with TestClient(fake_gateway()) as c:
        r = c.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["cache-control"] == "no-store"
    page = r.text
    assert not re.search(r"\b(src|href)\s*=", page), "no external scripts, styles or links"
    assert "@import" not in page and "url(" not in page
    assert '"v1/ranks"' in page and '"v1/steps/"' in page, "relative fetches"
    assert "<b>" not in render_page(title="<b>x</b>").split("<body")[0]
    with pytest.raises(ValueError):
        render_page(steps=0)


# what the captures wait for (real time, within capture's deadline): the page's hooks
REFRESHED = 'document.body.dataset.state === "ready" && +document.body.dataset.updates >= 1'
FAILED = 'document.body.dataset.state === "error"'


def _require_chromium() -> str:
    binary = chromium()
    if binary is None:
        pytest.skip("chromium not installed and apt-get not usable (or no `websockets`, its "
                    "DevTools client): browser test not run")
    return binary


def test_chromium_renders_ranks_and_timelines() -> None:
    binary = _require_chromium()
    with serve_app(fake_gateway()) as url:
        shot = OUT / "status_page_fake.png"
        dom = Dom(capture(binary, url + "/", shot, until=REFRESHED))
    body = dom.body()
    assert body["data-state"] == "ready" and int(body["data-updates"]) >= 1, body
    assert "data-pwned" not in body, "an error string was run as HTML"
    assert len(dom.find("script")) == 1
    assert EVIL in "".join(dom.text), "the error is shown as text"
    assert {a["data-rank"] for a in dom.find("tr") if "data-rank" in a} == {"r0", "r1", "r2"}
    rows = dom.with_class("g", "rank-row")
    by = {(int(a["data-step"]), a["data-rank"]): a for a in rows}
    # steps 4 (running), 3, 2 from the timeline, 0 from the gateway's summary; 1 is a 404
    assert {s for s, _ in by} == {0, 2, 3, 4}
    for step in (2, 3, 4):
        assert {r for s, r in by if s == step} == {"r0", "r1", "r2"}
    done = by[(3, "r0")]
    assert float(done["data-decode-s"]) == pytest.approx(4, abs=1e-3)
    assert float(done["data-pregen-s"]) == pytest.approx(5, abs=1e-3)
    assert float(done["data-idle-s"]) == pytest.approx(1, abs=1e-3)
    running = by[(4, "r0")]  # provisional: 6 s so far, 4 decoding, 2 pre-generating
    assert float(running["data-decode-s"]) + float(running["data-pregen-s"]) + \
        float(running["data-idle-s"]) == pytest.approx(6, abs=1e-3)
    assert float(by[(0, "r1")]["data-decode-s"]) == pytest.approx(5, abs=1e-3)
    steps = {a["data-step"]: a["data-complete"] for a in dom.with_class("g", "step")}
    assert steps == {"4": "false", "3": "true", "2": "true", "0": "unknown"}
    kinds = {a["data-kind"] for a in dom.find("rect") if "data-kind" in a}
    assert kinds == {"decode", "pregen", "idle"}
    assert shot.stat().st_size > 5000


def test_chromium_shows_a_failed_refresh() -> None:
    binary = _require_chromium()
    with serve_app(fake_gateway(broken=True)) as url:
        dom = Dom(capture(binary, url + "/", until=FAILED))
    assert dom.body()["data-state"] == "error"
    assert "refresh failed" in "".join(dom.text) and "HTTP 500" in "".join(dom.text)
