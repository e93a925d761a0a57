"""deploy/k8s: the manifests parse, validate against the Kubernetes schemas (when
kubernetes-validate is installed), run only commands, flags, env vars and config files the CLI
accepts, and are wired together (selectors, ports, probes, secrets, ServiceMonitors)."""

from __future__ import annotations

import re
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.helpers import DEPLOY, check_command, run

K8S = DEPLOY / "k8s"
WORKLOADS = ("Deployment", "StatefulSet")
FAKE_POD_IP = "10.1.2.3"
CONFIGMAP = "bubblespec-config"
SECRET = "bubblespec-token"


@cache
def kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


@cache
def docs() -> list[dict[str, Any]]:
    out = []
    for res in kustomization()["resources"]:
        out += [d for d in yaml.safe_load_all((K8S / res).read_text()) if d is not None]
    return out


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in docs() if d["kind"] == kind]


def by_name(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in of_kind(kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def containers() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every container of every Deployment/StatefulSet."""
    return [(w, c) for w in docs() if w["kind"] in WORKLOADS
            for c in w["spec"]["template"]["spec"]["containers"]]


def generated_files() -> dict[str, Path]:
    """{key: file} of the bubblespec-config ConfigMap generator."""
    gens = {g["name"]: g for g in kustomization().get("configMapGenerator", [])}
    assert CONFIGMAP in gens, "the config ConfigMap comes from configMapGenerator"
    out = {}
    for f in gens[CONFIGMAP]["files"]:
        key, _, path = f.rpartition("=") if "=" in f else (Path(f).name, "", f)
        out[key] = K8S / path
    return out


def container_files(workload: dict[str, Any], container: dict[str, Any]) -> dict[str, Path]:
    """{path in the container: repo file} for the config ConfigMap's mounted keys."""
    vols = {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes", [])}
    out = {}
    for m in container.get("volumeMounts", []):
        cm = vols[m["name"]].get("configMap")
        if cm and cm["name"] == CONFIGMAP:
            for key, path in generated_files().items():
                out[f"{m['mountPath'].rstrip('/')}/{key}"] = path
    return out


_DEP = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's env as the kubelet resolves it (secrets -> a placeholder, the pod IP ->
    a fixed address, `$(VAR)` -> earlier variables)."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = _DEP.sub(lambda m: env.get(m.group(1), m.group(0)), str(e["value"]))
        elif "secretKeyRef" in e.get("valueFrom", {}):
            env[e["name"]] = "from-secret"
        elif "fieldRef" in e.get("valueFrom", {}):
            field = e["valueFrom"]["fieldRef"]["fieldPath"]
            env[e["name"]] = FAKE_POD_IP if field == "status.podIP" else f"<{field}>"
        else:
            raise AssertionError(f"{container['name']}: env {e['name']}: unsupported source")
    return env


def argv_of(container: dict[str, Any]) -> list[str]:
    assert "command" not in container, "keep the image's `bubblespec` entrypoint"
    return ["bubblespec", *container["args"]]


@cache
def loaded() -> dict[str, Any]:
    """{container name: validated config} for every bubblespec container."""
    out = {}
    for w, c in containers():
        out[c["name"]] = check_command(argv_of(c), container_env(c),
                                       files=container_files(w, c),
                                       where=f"{w['kind']}/{w['metadata']['name']}")
    return out


def role(container: dict[str, Any]) -> str:
    return container["args"][0]


def test_every_document_has_api_version_kind_and_name() -> None:
    assert docs()
    for d in docs():
        assert {"apiVersion", "kind", "metadata"} <= set(d), d
        assert d["metadata"].get("name"), d


def test_kustomization_lists_every_manifest() -> None:
    listed = set(kustomization()["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk, (listed ^ on_disk)
    for path in generated_files().values():
        assert path.is_file(), path
    assert kustomization().get("namespace") == "bubblespec"


def test_core_resources_match_the_kubernetes_schema() -> None:
    kv = pytest.importorskip("kubernetes_validate",
                             reason="kubernetes-validate not installed (pip install "
                                    "kubernetes-validate): schema check skipped")
    checked = 0
    for d in docs():
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # CRDs: checked structurally below
        kv.validate(d, "1.30", strict=True)
        checked += 1
    assert checked >= 7


def test_every_command_flag_env_var_and_config_file_is_accepted() -> None:
    cfgs = loaded()
    assert {role(c) for _w, c in containers()} == {"sync", "rank", "gateway"}
    for _w, c in containers():
        env = container_env(c)
        cfg_vars = [k for k in env if k.endswith("_CONFIG")]
        assert cfg_vars, f"{c['name']}: reads its settings from the ConfigMap"
    assert cfgs


def test_images_are_the_services_images_and_overridable() -> None:
    names = {i["name"] for i in kustomization()["images"]}
    for _w, c in containers():
        image = c["image"].split(":")[0]
        assert image in names, f"{c['name']}: image {image} not in kustomization images"
        want = {"sync": "bubblespec-synchronizer", "rank": "bubblespec-rank",
                "gateway": "bubblespec-gateway"}[role(c)]
        assert image == want


def _service_for(workload: dict[str, Any]) -> list[dict[str, Any]]:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return [s for s in of_kind("Service")
            if s["spec"]["selector"].items() <= labels.items()]


def test_services_select_pods_and_target_named_ports() -> None:
    for w, c in containers():
        assert w["spec"]["selector"]["matchLabels"].items() <= \
            w["spec"]["template"]["metadata"]["labels"].items()
        services = _service_for(w)
        assert services, f"no Service selects {w['metadata']['name']}"
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for s in services:
            for p in s["spec"]["ports"]:
                assert p["targetPort"] in ports or p["targetPort"] in ports.values(), \
                    (s["metadata"]["name"], p)


def _port(container: dict[str, Any], ref: Any) -> int:
    if isinstance(ref, int):
        return ref
    return {p["name"]: p["containerPort"] for p in container["ports"]}[ref]


def test_synchronizer_has_native_grpc_probes_and_one_replica() -> None:
    (w, c), = [(w, c) for w, c in containers() if role(c) == "sync"]
    cfg = loaded()[c["name"]]
    assert w["kind"] == "Deployment" and w["spec"]["replicas"] == 1
    assert w["spec"]["strategy"]["type"] == "Recreate"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == cfg.port, probe
    assert cfg.host == "0.0.0.0" and cfg.metrics_port > 0
    assert _port(c, "metrics") == cfg.metrics_port and _port(c, "grpc") == cfg.port
    assert cfg.token is not None, "the bearer token comes from the Secret"


def test_sync_address_is_the_synchronizer_service() -> None:
    (_w, sc), = [(w, c) for w, c in containers() if role(c) == "sync"]
    svc = by_name("Service", "bubblespec-synchronizer")
    port = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
    assert _port(sc, port["targetPort"]) == loaded()[sc["name"]].port
    want = f"{svc['metadata']['name']}:{port['port']}"
    for _w, c in containers():
        if role(c) in ("rank", "gateway"):
            assert loaded()[c["name"]].sync_address == want, c["name"]


def test_ranks_are_a_gpu_statefulset_named_by_ordinal(monkeypatch: pytest.MonkeyPatch) -> None:
    (w, c), = [(w, c) for w, c in containers() if role(c) == "rank"]
    cfg = loaded()[c["name"]]
    assert w["kind"] == "StatefulSet"
    svc = by_name("Service", w["spec"]["serviceName"])
    assert svc["spec"].get("clusterIP") == "None", "a headless governing Service"
    assert str(c["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    assert cfg.rank_id == "", "the rank id must come from the pod ordinal"
    assert cfg.advertise_address == f"{FAKE_POD_IP}:{cfg.port}"
    assert cfg.host == "0.0.0.0" and cfg.token is not None and cfg.sync_token is not None
    for probe in ("startupProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health_generate"
        assert _port(c, c[probe]["httpGet"]["port"]) == cfg.port
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    # the rank server derives r<n> from the StatefulSet hostname <name>-<n>
    from bubblespec.rank import service

    monkeypatch.setattr(service.socket, "gethostname", lambda: f"{w['metadata']['name']}-3")
    assert service.default_rank_id(cfg) == "r3"


def test_gateway_deployment_and_service() -> None:
    (w, c), = [(w, c) for w, c in containers() if role(c) == "gateway"]
    cfg = loaded()[c["name"]]
    assert w["kind"] == "Deployment" and w["spec"]["replicas"] == 1
    svc = _service_for(w)[0]
    assert [p["port"] for p in svc["spec"]["ports"]] == [cfg.port]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health_generate"
    assert cfg.discover_ranks and cfg.token is not None
    assert cfg.rank_token is not None and cfg.sync_token is not None


def test_secret_refs_and_token() -> None:
    secret = by_name("Secret", SECRET)
    keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    for _w, c in containers():
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == SECRET and ref["key"] in keys, (c["name"], ref)
                assert "TOKEN" in e["name"], e["name"]


def test_servicemonitors_select_services_with_their_ports() -> None:
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"] for j in prom["scrape_configs"] if j["job_name"].startswith("bubble")}
    monitored = set()
    for sm in of_kind("ServiceMonitor"):
        sel = sm["spec"]["selector"]["matchLabels"]
        matched = [s for s in of_kind("Service")
                   if sel.items() <= s["metadata"]["labels"].items()]
        assert len(matched) == 1, sm["metadata"]["name"]
        svc = matched[0]
        names = {p["name"] for p in svc["spec"]["ports"]}
        for ep in sm["spec"]["endpoints"]:
            assert ep["port"] in names and ep.get("path", "/metrics") == "/metrics"
        monitored.add(svc["metadata"]["name"])  # job label = Service name
    assert monitored == jobs, (monitored, jobs)


def test_prometheusrule_is_alerts_yml() -> None:
    (rule,) = of_kind("PrometheusRule")
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    assert rule["spec"] == alerts, "deploy/k8s/prometheusrule.yaml differs from alerts.yml"


def test_kubectl_kustomize_builds_if_available() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: `kubectl kustomize` not run")
    r = run([kubectl, "kustomize", str(K8S)])
    assert r.returncode == 0, r.stderr
    built = [d for d in yaml.safe_load_all(r.stdout) if d]
    kinds = sorted((d["kind"], d["metadata"]["name"].rsplit("-", 1)[0]
                    if d["kind"] == "ConfigMap" else d["metadata"]["name"]) for d in built)
    want = sorted([(d["kind"], d["metadata"]["name"]) for d in docs()]
                  + [("ConfigMap", CONFIGMAP)])
    assert kinds == want
    cm = next(d for d in built if d["kind"] == "ConfigMap")
    assert set(cm["data"]) == set(generated_files())
    for d in built:
        if d["kind"] in WORKLOADS:
            vols = d["spec"]["template"]["spec"]["volumes"]
            assert any(v.get("configMap", {}).get("name") == cm["metadata"]["name"]
                       for v in vols), "workloads use the hashed ConfigMap name"
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "bubblespec"


# ---------------------------------------------------------------------- the TLS overlay
TLS_DIR = DEPLOY / "k8s-tls"
TLS_SECRET = "bubblespec-tls"
TLS_MOUNT = "/var/run/bubblespec-tls"


def _tls_patches() -> dict[tuple[str, str], dict[str, Any]]:
    k = yaml.safe_load((TLS_DIR / "kustomization.yaml").read_text())
    assert k["resources"] == ["../k8s"]
    listed = {p["path"] for p in k["patches"]}
    on_disk = {p.name for p in TLS_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk, listed ^ on_disk
    out = {}
    for name in sorted(listed):
        d = yaml.safe_load((TLS_DIR / name).read_text())
        out[(d["kind"], d["metadata"]["name"])] = d
    return out


def _merge_env(base: list[dict[str, Any]], patch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A strategic merge of env lists as kustomize makes it: the patch's entries first, in
    their order, then the base's other entries (which matters to `$(VAR)` references)."""
    names = {e["name"] for e in patch}
    return [*patch, *(e for e in base if e["name"] not in names)]


def test_tls_overlay_patches_every_service(tmp_path: Path) -> None:
    from bubblespec.tls import write_throwaway_pki

    pki = write_throwaway_pki(tmp_path)
    real = {f"{TLS_MOUNT}/ca.crt": str(pki.ca), f"{TLS_MOUNT}/tls.crt": str(pki.cert),
            f"{TLS_MOUNT}/tls.key": str(pki.key)}
    patches = _tls_patches()
    for (kind, name), patch in patches.items():
        by_name(kind, name)  # the patch targets a resource of the base
    patched = set()
    for w, c in containers():
        patch = patches.get((w["kind"], w["metadata"]["name"]))
        assert patch is not None, f"{w['metadata']['name']}: no TLS patch"
        spec = patch["spec"]["template"]["spec"]
        (pc,) = spec["containers"]
        assert pc["name"] == c["name"]
        vols = {v["name"]: v for v in spec["volumes"]}
        (mount,) = pc["volumeMounts"]
        assert mount["mountPath"] == TLS_MOUNT
        assert vols[mount["name"]]["secret"]["secretName"] == TLS_SECRET
        env = container_env({"name": c["name"], "env": _merge_env(c["env"], pc["env"])})
        tls = {k: v for k, v in env.items() if "_TLS_" in k}
        assert len(tls) == 4, tls
        env = {k: real.get(v, v) for k, v in env.items()}
        cfg = check_command(argv_of(c), env, files=container_files(w, c),
                            where=f"tls/{w['metadata']['name']}")
        assert cfg.tls_server and cfg.tls_client and cfg.tls_client_auth
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe not in c:
                continue
            p = pc[probe]
            assert set(p) >= {"exec"} and (p.get("httpGet", 0) is None
                                           or p.get("grpc", 0) is None), probe
            args = check_command(p["exec"]["command"], where=f"{c['name']}.{probe}")
            assert args.tls_ca in real and args.tls_cert in real and args.tls_key in real
            target = args.grpc or args.http
            port = cfg.port
            assert f"localhost:{port}" in target, (probe, target)
            assert args.grpc or target.startswith("https://")
        if role(c) == "rank":
            assert cfg.advertise_address == f"<metadata.name>.bubblespec-rank." \
                                            f"<metadata.namespace>.svc:{cfg.port}"
        patched.add(c["name"])
    assert patched == {"synchronizer", "rank", "gateway"}
    for sm in ("bubblespec-rank", "bubblespec-gateway"):
        (ep,) = patches[("ServiceMonitor", sm)]["spec"]["endpoints"]
        (base_ep,) = by_name("ServiceMonitor", sm)["spec"]["endpoints"]
        assert {k: ep[k] for k in base_ep} == base_ep and ep["scheme"] == "https"
        tc = ep["tlsConfig"]
        assert {tc["ca"]["secret"]["name"], tc["cert"]["secret"]["name"],
                tc["keySecret"]["name"]} == {TLS_SECRET}


def test_tls_overlay_builds_if_kubectl_available() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: `kubectl kustomize` not run")
    r = run([kubectl, "kustomize", str(TLS_DIR)])
    assert r.returncode == 0, r.stderr
    for d in yaml.safe_load_all(r.stdout):
        if d and d["kind"] in WORKLOADS:
            (c,) = d["spec"]["template"]["spec"]["containers"]
            assert "exec" in c["readinessProbe"] and "httpGet" not in c["readinessProbe"]
            assert "grpc" not in c["readinessProbe"]
            env = container_env(c)
            assert not any("$(" in v for v in env.values()), env
            if c["name"] == "rank":
                assert env["BUBBLESPEC_RANK_ADVERTISE_ADDRESS"].startswith("<metadata.name>.")
