"""The Grafana dashboard, the Prometheus scrape config and the alert rules: they parse, use
only metric names the metrics modules export, and pass promtool (config check, rule check, rule
unit tests in alerts_test.yml) when Debian's `prometheus` package is installed."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.helpers import (
    DEPLOY,
    HERE,
    declared_metrics,
    metric_names,
    promtool,
    run,
    unknown_metrics,
)

DASHBOARD = DEPLOY / "grafana" / "bubblespec.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"

ACCEPTED = "bubblespec_spec_decode_num_accepted_tokens_total"
DRAFT_TOKENS = "bubblespec_spec_decode_num_draft_tokens_total"
DRAFTS = "bubblespec_spec_decode_num_drafts_total"


@cache
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    out = []
    for p in dashboard()["panels"]:
        out.append(p)
        out += p.get("panels", [])  # collapsed rows
    return out


def exprs() -> list[tuple[str, str]]:
    """(panel title, expr) of every query in the dashboard."""
    return [(p["title"], t["expr"]) for p in panels() for t in p.get("targets", [])]


@cache
def alerts() -> dict[str, Any]:
    return yaml.safe_load(ALERTS.read_text())


def rules() -> list[dict[str, Any]]:
    return [r for g in alerts()["groups"] for r in g["rules"]]


def require_promtool() -> str:
    tool = promtool()
    if tool is None:
        pytest.skip("promtool not installed (apt-get install prometheus): not run")
    return tool


# ---------------------------------------------------------------------- Grafana


def test_dashboard_parses_with_unique_ids_and_no_overlaps() -> None:
    d = dashboard()
    assert d["uid"] == "bubblespec" and d["title"] and d["schemaVersion"] >= 36
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels():
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine


def test_dashboard_queries_use_the_datasource_variable() -> None:
    names = {v["name"] for v in dashboard()["templating"]["list"]}
    assert {"datasource", "rank"} <= names
    for p in panels():
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"].strip()


def test_every_dashboard_metric_exists() -> None:
    declared = declared_metrics()
    for title, expr in exprs():
        assert not unknown_metrics(expr, declared), (title, unknown_metrics(expr, declared))
    for v in dashboard()["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            assert not unknown_metrics(q, declared), (v["name"], q)


def test_dashboard_covers_what_issue_6_asks_for() -> None:
    used = set().union(*(metric_names(e) for _t, e in exprs()))
    for m in ("bubblespec_step_shard_duration_seconds_sum",      # busy time per step
              "bubblespec_step_bubble_seconds_sum",              # bubble time per step
              "bubblespec_step_pregen_seconds_sum",              # pre-gen time per step
              "bubblespec_pregen_tokens_total",                  # pre-gen tokens
              ACCEPTED, DRAFT_TOKENS, DRAFTS,                    # acceptance, accepted length
              "bubblespec_draft_store_bytes",                    # draft-store size
              "bubblespec_step_duration_seconds_bucket",         # step duration
              "bubblespec_gateway_request_duration_seconds_bucket",  # request latency
              "bubblespec_request_latency_seconds_bucket"):
        assert m in used, m
    flat = {t: re.sub(r"\s+", " ", e) for t, e in exprs()}
    # vLLM's formulas: acceptance = rate(accepted) / rate(draft tokens);
    # mean accepted length = 1 + rate(accepted) / rate(drafts)
    acc = [e for t, e in flat.items() if t == "Draft acceptance rate"]
    assert acc and all(re.search(rf"{ACCEPTED}.*\) / .*{DRAFT_TOKENS}", e) for e in acc)
    mal = [e for t, e in flat.items() if t == "Mean accepted length"]
    assert mal and all(e.startswith("1 + ") and re.search(rf"{ACCEPTED}.*\) / .*{DRAFTS}", e)
                       for e in mal)
    titles = {p["title"] for p in panels()}
    for want in ("Busy time per step", "Bubble time per step", "Pre-gen time per step",
                 "Bubble share recovered", "Pre-generated tokens", "Draft store size",
                 "Step duration", "Request latency p95"):
        assert want in titles, want


def _dashboard_as_rules(tmp: Path) -> Path:
    """The dashboard's queries as recording rules, Grafana macros replaced by values."""
    subst = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "15s",
             "$rank": ".*", "${rank}": ".*"}
    out = []
    for i, (_title, expr) in enumerate(exprs()):
        for k, v in subst.items():
            expr = expr.replace(k, v)
        assert "$" not in expr, expr
        out.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": out}]}))
    return path


def test_dashboard_promql_is_valid(tmp_path: Path) -> None:
    tool = require_promtool()
    r = run([tool, "check", "rules", str(_dashboard_as_rules(tmp_path))])
    assert r.returncode == 0, r.stdout + r.stderr


def test_grafana_provisioning_parses() -> None:
    prov = DEPLOY / "grafana" / "provisioning"
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())
    assert ds["apiVersion"] == 1 and ds["datasources"][0]["type"] == "prometheus"
    dash = yaml.safe_load((prov / "dashboards" / "bubblespec.yml").read_text())
    assert dash["apiVersion"] == 1 and dash["providers"][0]["type"] == "file"


# ---------------------------------------------------------------------- Prometheus


def test_alert_rules_parse_and_use_existing_metrics() -> None:
    declared = declared_metrics()
    names = {r.get("alert") for r in rules()}
    for want in ("BubblespecRankDown", "BubblespecSynchronizerDown",
                 "BubblespecDraftAcceptanceCollapsed"):
        assert want in names, want
    for r in rules():
        assert ("alert" in r) != ("record" in r) and r["expr"].strip(), r
        assert not unknown_metrics(r["expr"], declared), (r, unknown_metrics(r["expr"],
                                                                             declared))
        if "alert" in r:
            assert r["labels"]["severity"] in ("critical", "warning", "info")
            assert r["annotations"]["summary"] and r["annotations"]["description"]


def test_alert_jobs_are_scraped() -> None:
    prom = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {j["job_name"] for j in prom["scrape_configs"]}
    for r in rules():
        for job in re.findall(r'job="([^"]+)"', r["expr"]):
            assert job in jobs, (r.get("alert"), job)


def test_promtool_check_rules() -> None:
    tool = require_promtool()
    r = run([tool, "check", "rules", str(ALERTS)])
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_promtool_rule_unit_tests() -> None:
    tool = require_promtool()
    r = run([tool, "test", "rules", "alerts_test.yml"], cwd=HERE)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_promtool_check_config(tmp_path: Path) -> None:
    tool = require_promtool()
    cfg = yaml.safe_load(PROMETHEUS.read_text())
    # the compose file mounts alerts.yml at the rule_files path; here it sits beside the copy
    cfg["rule_files"] = [Path(p).name for p in cfg["rule_files"]]
    (tmp_path / "alerts.yml").write_text(ALERTS.read_text())
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    r = run([tool, "check", "config", str(tmp_path / "prometheus.yml")])
    assert r.returncode == 0, r.stdout + r.stderr
