"""docker-compose.yml: parses, matches the Compose schema, and runs only commands, flags and
environment variables that the bubblespec CLI accepts; its wiring (addresses, ports, mounts,
scrape targets, healthchecks) is consistent. No Docker engine is needed."""

from __future__ import annotations

import copy
import json
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.helpers import (
    DEPLOY,
    HERE,
    REPO,
    check_command,
    env_mapping,
    interpolate,
    plain_parser,
    run,
)

COMPOSE = REPO / "docker-compose.yml"


@cache
def raw() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@cache
def compose() -> dict[str, Any]:
    """The file as Compose sees it with no variables set (`${X:-default}` -> default)."""
    return interpolate(raw())


def services() -> dict[str, Any]:
    return compose()["services"]


def bubblespec_services() -> dict[str, Any]:
    return {n: s for n, s in services().items() if "build" in s}


def dockerfile_entrypoint(path: Path) -> list[str]:
    for line in path.read_text().splitlines():
        if line.startswith("ENTRYPOINT"):
            return json.loads(line[len("ENTRYPOINT"):])
    raise AssertionError(f"{path}: no ENTRYPOINT")


def container_argv(name: str) -> list[str]:
    """What the container runs: the image's ENTRYPOINT + the service's command."""
    s = services()[name]
    entry = dockerfile_entrypoint(REPO / s["build"]["dockerfile"])
    assert entry == ["bubblespec"], f"{name}: entrypoint {entry}"
    cmd = s["command"]
    assert isinstance(cmd, list), f"{name}: command should be a list (exec form)"
    return entry + cmd


@cache
def configs() -> dict[str, Any]:
    """Every bubblespec service's validated config (or argparse namespace)."""
    return {n: check_command(container_argv(n), env_mapping(s.get("environment")),
                             where=f"docker-compose.yml services.{n}")
            for n, s in bubblespec_services().items()}


def test_parses_and_matches_the_compose_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed")
    schema = json.loads((HERE / "compose-spec.json").read_text())
    jsonschema.Draft7Validator(schema).validate(compose())
    # the schema is strict: a misspelt key is caught
    broken = copy.deepcopy(compose())
    broken["services"]["rank0"]["helthcheck"] = broken["services"]["rank0"].pop("healthcheck")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(broken)


def test_docker_compose_config_if_available() -> None:
    docker = shutil.which("docker")
    if docker is None or run([docker, "compose", "version"]).returncode != 0:
        pytest.skip("no `docker compose` plugin here (the schema test covers the syntax)")
    r = run([docker, "compose", "-f", str(COMPOSE), "config", "-q"], cwd=REPO)
    assert r.returncode == 0, r.stderr


def test_expected_services() -> None:
    names = set(services())
    assert {"synchronizer", "gateway", "prometheus", "grafana"} <= names
    ranks = [n for n in bubblespec_services() if container_argv(n)[1] == "rank"]
    assert len(ranks) == 2, ranks
    roles = {container_argv(n)[1] for n in bubblespec_services()}
    assert roles == {"sync", "rank", "gateway"}


def test_every_command_and_env_var_is_accepted_by_the_cli() -> None:
    cfgs = configs()
    assert set(cfgs) == set(bubblespec_services())


def test_dockerfiles_and_build_contexts_exist() -> None:
    for name, s in bubblespec_services().items():
        assert s["build"]["context"] == ".", name
        assert (REPO / s["build"]["dockerfile"]).is_file(), name
        assert s["image"].startswith("bubblespec-"), name


def test_ranks_use_the_embedded_model_on_cpu() -> None:
    for name, cfg in configs().items():
        if container_argv(name)[1] != "rank":
            continue
        assert cfg.model == "", f"{name}: the compose ranks serve the embedded model"
        assert "Dockerfile.gpu" not in services()[name]["build"]["dockerfile"]


def test_addresses_point_at_services_and_ports() -> None:
    cfgs = configs()
    sync = next(n for n in cfgs if container_argv(n)[1] == "sync")
    sync_addr = f"{sync}:{cfgs[sync].port}"
    assert cfgs[sync].host == "0.0.0.0"
    rank_ids = set()
    for name, cfg in cfgs.items():
        role = container_argv(name)[1]
        if role in ("rank", "gateway"):
            assert cfg.sync_address == sync_addr, name
            assert cfg.host == "0.0.0.0", f"{name} must listen on all interfaces"
        if role == "rank":
            host = services()[name].get("hostname", name)
            assert cfg.advertise_address in (f"{name}:{cfg.port}", f"{host}:{cfg.port}"), name
            rank_ids.add(cfg.rank_id)
        if role == "gateway":
            rank_services = {n: c for n, c in cfgs.items() if container_argv(n)[1] == "rank"}
            want = {f"{n}:{c.port}" for n, c in rank_services.items()}
            assert set(cfg.ranks) <= want, cfg.ranks
    assert len(rank_ids) == 2 and "" not in rank_ids, rank_ids


def _probe_argv(name: str) -> list[str]:
    test = services()[name]["healthcheck"]["test"]
    assert isinstance(test, list) and test[0] == "CMD", f"{name}: healthcheck in exec form"
    return test[1:]


def test_healthchecks_use_bubblespec_health_on_the_right_port() -> None:
    cfgs = configs()
    for name in bubblespec_services():
        argv = _probe_argv(name)
        assert argv[:2] == ["bubblespec", "health"], name
        args = check_command(argv, where=f"{name}.healthcheck")
        role, cfg = container_argv(name)[1], cfgs[name]
        if role == "sync":
            assert args.grpc == f"127.0.0.1:{cfg.port}", name
        else:
            assert args.http == f"http://127.0.0.1:{cfg.port}/health_generate", name
        hc = services()[name]["healthcheck"]
        assert "start_period" in hc and "timeout" in hc, name


def test_depends_on_refers_to_services_with_healthchecks() -> None:
    for name, s in services().items():
        deps = s.get("depends_on") or {}
        if isinstance(deps, list):
            deps = {d: {"condition": "service_started"} for d in deps}
        for dep, spec in deps.items():
            assert dep in services(), f"{name} depends on unknown {dep}"
            if spec.get("condition") == "service_healthy":
                assert "healthcheck" in services()[dep], f"{dep} has no healthcheck"


def _bind_mounts(name: str) -> list[tuple[Path, str]]:
    out = []
    for v in services()[name].get("volumes", []):
        src, dst = v.split(":")[:2]
        if src.startswith((".", "/")):
            out.append(((REPO / src).resolve(), dst))
    return out


def test_bind_mounts_exist() -> None:
    for name in services():
        for src, _dst in _bind_mounts(name):
            assert src.exists(), f"{name}: bind mount source {src} is missing"


def test_prometheus_scrapes_every_bubblespec_process() -> None:
    mounts = {dst: src for src, dst in _bind_mounts("prometheus")}
    flags = dict(a.split("=", 1) for a in services()["prometheus"]["command"] if "=" in a)
    config_path = mounts[flags["--config.file"]]
    prom = yaml.safe_load(config_path.read_text())
    for rule_file in prom.get("rule_files", []):
        assert rule_file in mounts, f"rule file {rule_file} is not mounted"
    targets = {job["job_name"]: {t for sc in job["static_configs"] for t in sc["targets"]}
               for job in prom["scrape_configs"]}
    cfgs = configs()
    want: dict[str, set[str]] = {"bubblespec-synchronizer": set(), "bubblespec-rank": set(),
                                 "bubblespec-gateway": set()}
    for name, cfg in cfgs.items():
        role = container_argv(name)[1]
        if role == "sync":
            want["bubblespec-synchronizer"].add(f"{name}:{cfg.metrics_port}")
        elif role == "rank":
            host = services()[name].get("hostname", name)
            want["bubblespec-rank"].add(f"{host}:{cfg.port}")
        else:
            want["bubblespec-gateway"].add(f"{name}:{cfg.port}")
    for job, tgts in want.items():
        assert targets.get(job) == tgts, (job, targets.get(job), tgts)


def test_grafana_provisioning_mounts() -> None:
    mounts = {dst: src for src, dst in _bind_mounts("grafana")}
    assert "/etc/grafana/provisioning" in mounts
    prov = mounts["/etc/grafana/provisioning"]
    provider = yaml.safe_load((prov / "dashboards" / "bubblespec.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    dashboards = [dst for dst in mounts if dst.startswith(path.rstrip("/") + "/")]
    assert dashboards, f"no dashboard mounted under {path}"
    for dst in dashboards:
        json.loads(mounts[dst].read_text())
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())
    url = ds["datasources"][0]["url"]
    assert url == "http://prometheus:9090", url
    home = services()["grafana"]["environment"].get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    assert home is None or home in mounts


def test_token_is_shared_and_optional() -> None:
    """Unset BUBBLESPEC_TOKEN -> no auth anywhere; set -> the same token everywhere."""
    env = {"BUBBLESPEC_TOKEN": "s3cret"}
    withtok = interpolate(raw(), env)["services"]
    for name in bubblespec_services():
        e = env_mapping(withtok[name].get("environment"))
        tokens = {k: v for k, v in e.items() if k.endswith("TOKEN")}
        assert tokens and set(tokens.values()) == {"s3cret"}, (name, tokens)
        cfg = check_command(container_argv(name), e, where=name)
        assert cfg.token is not None and cfg.token.get_secret_value() == "s3cret"
        assert configs()[name].token is None
    assert plain_parser("health") is not None


# ---------------------------------------------------------------------- the TLS overlay
TLS_OVERLAY = REPO / "deploy" / "compose.tls.yml"
SECRETS = "/run/secrets/"


@cache
def tls_overlay() -> dict[str, Any]:
    return yaml.safe_load(TLS_OVERLAY.read_text())


def test_tls_overlay_matches_the_compose_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed")
    schema = json.loads((HERE / "compose-spec.json").read_text())
    jsonschema.Draft7Validator(schema).validate(tls_overlay())


def test_tls_overlay_turns_on_mutual_tls_everywhere(tmp_path: Path) -> None:
    """Every bubblespec service gets the three secrets and valid tls_* settings (the secret
    files as the python line in the overlay's header writes them); the healthchecks and
    Prometheus present the client certificate."""
    from bubblespec.tls import write_throwaway_pki

    pki = write_throwaway_pki(tmp_path)
    over = tls_overlay()
    secrets = over["secrets"]
    files = {name: Path(s["file"]).name for name, s in secrets.items()}
    assert files == {"bubblespec-tls-ca": pki.ca.name, "bubblespec-tls-cert": pki.cert.name,
                     "bubblespec-tls-key": pki.key.name}
    assert all(s["file"].startswith("./deploy/tls/") for s in secrets.values())
    real = {SECRETS + name: str(tmp_path / f) for name, f in files.items()}
    for name, base in bubblespec_services().items():
        patch = over["services"][name]
        assert set(patch["secrets"]) == set(secrets), name
        env = {**env_mapping(base.get("environment")), **env_mapping(patch["environment"])}
        env = {k: real.get(v, v) for k, v in env.items()}
        cfg = check_command(container_argv(name), env, where=f"compose.tls.yml {name}")
        assert cfg.tls_server and cfg.tls_client and cfg.tls_client_auth, name
        test = patch["healthcheck"]["test"]
        assert test[0] == "CMD"
        args = check_command(test[1:], where=f"compose.tls.yml {name}.healthcheck")
        assert {args.tls_ca, args.tls_cert, args.tls_key} <= set(real), name
        if container_argv(name)[1] == "sync":
            assert args.grpc == f"localhost:{cfg.port}", name
        else:
            assert args.http == f"https://localhost:{cfg.port}/health_generate", name
    prom = over["services"]["prometheus"]
    (mount,) = prom["volumes"]
    src, dst = mount.split(":")[:2]
    assert dst == "/etc/prometheus/prometheus.yml" and (REPO / src).is_file()
    plain = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    tls = yaml.safe_load((REPO / src).read_text())
    strip = {"scheme", "tls_config"}
    assert [{k: v for k, v in j.items() if k not in strip} for j in tls["scrape_configs"]] \
        == plain["scrape_configs"]
    assert {k: v for k, v in tls.items() if k != "scrape_configs"} == \
        {k: v for k, v in plain.items() if k != "scrape_configs"}
    for job in tls["scrape_configs"]:
        if job["job_name"] in ("bubblespec-rank", "bubblespec-gateway"):
            assert job["scheme"] == "https"
            assert set(job["tls_config"].values()) <= set(real), job

