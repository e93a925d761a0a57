"""deploy/kuberay: the manifests parse, validate against the KubeRay CRD schemas (when
BUBBLESPEC_KUBERAY_CRDS names a directory holding ray.io_rayclusters.yaml and
ray.io_rayjobs.yaml from ray-project/kuberay, ray-operator/config/crd/bases), run only
commands and flags the real parsers accept (`bubblespec ray up`, `ray start`), and are wired
together (the ports the command uses are the containers' named ports, the PodMonitors scrape
them under the job names the alert rules use, the image is the Dockerfile's)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from bubblespec.cli.ray import parse_args
from tests.deploy.helpers import DEPLOY, REPO, run

KUBERAY = DEPLOY / "kuberay"
CLUSTER = "bubblespec"


@cache
def docs() -> list[dict[str, Any]]:
    kust = yaml.safe_load((KUBERAY / "kustomization.yaml").read_text())
    out = []
    for res in kust["resources"]:
        out += [d for d in yaml.safe_load_all((KUBERAY / res).read_text()) if d is not None]
    return out


def one(kind: str) -> dict[str, Any]:
    found = [d for d in docs() if d["kind"] == kind]
    assert len(found) == 1, f"{kind}: {len(found)} found"
    return found[0]


def container(group: dict[str, Any]) -> dict[str, Any]:
    containers = group["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def ports(c: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: int(p["containerPort"]) for p in c.get("ports", [])}


def up_args() -> Any:
    argv = shlex.split(one("RayJob")["spec"]["entrypoint"])
    assert argv[:3] == ["bubblespec", "ray", "up"], argv
    return parse_args(argv[2:])


def strict(schema: Any) -> Any:
    """`schema` with unknown fields refused wherever Kubernetes would drop them (what
    `kubectl apply --validate=strict` reports): objects with `properties` get
    `additionalProperties: false` unless they preserve unknown fields."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


def test_every_manifest_is_listed_and_named() -> None:
    listed = set(yaml.safe_load((KUBERAY / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in KUBERAY.glob("*.yaml")} - {"kustomization.yaml"}
    for d in docs():
        assert d.get("apiVersion") and d.get("kind") and d["metadata"].get("name"), d


@pytest.mark.parametrize("kind,crd", [("RayCluster", "ray.io_rayclusters.yaml"),
                                      ("RayJob", "ray.io_rayjobs.yaml")])
def test_matches_the_kuberay_crd_schema(kind: str, crd: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    where = os.environ.get("BUBBLESPEC_KUBERAY_CRDS")
    if not where or not (Path(where) / crd).exists():
        pytest.skip("set BUBBLESPEC_KUBERAY_CRDS to a directory of KubeRay's CRD files")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are ~1 MB each
    definition = yaml.load((Path(where) / crd).read_text(), Loader=loader)
    versions = {v["name"]: v for v in definition["spec"]["versions"]}
    schema = strict(versions["v1"]["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: not in the CRD
    doc = one(kind)
    assert doc["apiVersion"] == "ray.io/v1"
    jsonschema.validate(doc, schema)
    bad = {**doc, "spec": {**doc["spec"], "entrypoints": "typo"}}
    with pytest.raises(jsonschema.ValidationError):  # the check refuses unknown fields
        jsonschema.validate(bad, schema)


def test_rayjob_runs_bubblespec_ray_up_on_the_raycluster() -> None:
    job, cluster = one("RayJob"), one("RayCluster")
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    assert cluster["metadata"]["name"] == CLUSTER
    args = up_args()
    assert args.address == "auto" and not args.detach  # the job lives as long as the actors
    assert args.gpus is True and args.strategy == "PACK"
    worker = cluster["spec"]["workerGroupSpecs"][0]
    assert worker["replicas"] == args.ranks  # one GPU worker per rank


def test_ray_start_params_are_ray_start_flags() -> None:
    from ray.scripts.scripts import start

    flags = {o for p in start.params for o in p.opts}
    spec = one("RayCluster")["spec"]
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        for key, value in group["rayStartParams"].items():
            assert f"--{key}" in flags, f"rayStartParams {key} is not a `ray start` flag"
            assert isinstance(value, str), f"rayStartParams {key} must be a string"


def test_ray_version_is_the_pinned_one() -> None:
    import ray

    pin = re.search(r'ray = \["ray\[default\]==([0-9.]+)"\]',
                    (REPO / "pyproject.toml").read_text())
    assert pin, "pyproject.toml pins ray in the `ray` extra"
    assert one("RayCluster")["spec"]["rayVersion"] == pin.group(1) == ray.__version__


def test_head_and_workers_expose_the_ports_the_command_uses() -> None:
    args, spec = up_args(), one("RayCluster")["spec"]
    head = ports(container(spec["headGroupSpec"]))
    assert {"gcs-server": 6379, "client": 10001, "dashboard": 8265}.items() <= head.items()
    assert head["gateway"] == args.gateway_port and head["sync-grpc"] == args.sync_port
    assert head["sync-metrics"] == args.sync_metrics_port
    assert spec["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"  # no rank on the head
    worker = container(spec["workerGroupSpecs"][0])
    assert ports(worker) == {"rank": args.rank_port_base}
    limits = worker["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 1  # one bundle, one rank, one port per worker pod


def test_podmonitors_scrape_every_role_under_the_alerts_job_names() -> None:
    alerts = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    spec = one("RayCluster")["spec"]
    pod_ports = {"head": set(ports(container(spec["headGroupSpec"]))),
                 "worker": {n for g in spec["workerGroupSpecs"] for n in ports(container(g))}}
    jobs = set()
    for mon in (d for d in docs() if d["kind"] == "PodMonitor"):
        sel = mon["spec"]["selector"]["matchLabels"]
        assert sel["ray.io/cluster"] == CLUSTER
        for ep in mon["spec"]["podMetricsEndpoints"]:
            assert ep["port"] in pod_ports[sel["ray.io/node-type"]], ep
            assert ep["path"] == "/metrics"
            job = [r["replacement"] for r in ep["relabelings"] if r["targetLabel"] == "job"]
            jobs |= set(job)
    assert jobs == {"bubblespec-gateway", "bubblespec-synchronizer", "bubblespec-rank"}
    for job in jobs:
        assert f'job="{job}"' in alerts


def test_images_are_the_dockerfiles_and_overridable() -> None:
    kust = yaml.safe_load((KUBERAY / "kustomization.yaml").read_text())
    names = {i["name"] for i in kust["images"]}
    spec = one("RayCluster")["spec"]
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        assert container(group)["image"].split(":")[0] in names
    dockerfile = (KUBERAY / "Dockerfile").read_text()
    assert '".[serve,ray]"' in dockerfile and "wget" in dockerfile
    assert "bubblespec.cluster.ray" in dockerfile  # the image imports what the job runs


def test_kubectl_kustomize_builds_if_available() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    out = run([kubectl, "kustomize", str(KUBERAY)])
    assert out.returncode == 0, out.stderr
    built = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert {d["kind"] for d in built} == {"Namespace", "RayCluster", "RayJob", "PodMonitor"}
    assert all(d["metadata"].get("namespace") == "bubblespec" for d in built
               if d["kind"] != "Namespace")


# ---------------------------------------------------------------------- the TLS overlay
TLS_DIR = DEPLOY / "kuberay-tls"
TLS_SECRET = "bubblespec-tls"


def _tls_patch(name: str) -> Any:
    return yaml.safe_load((TLS_DIR / name).read_text())


def test_tls_overlay_runs_ray_up_with_tls_from_the_secret() -> None:
    kust = yaml.safe_load((TLS_DIR / "kustomization.yaml").read_text())
    assert kust["resources"] == ["../kuberay"]
    listed = {p["path"] for p in kust["patches"]}
    assert listed == {p.name for p in TLS_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    targets = {(p["target"]["kind"], p["target"]["name"]) for p in kust["patches"]}
    assert targets <= {(d["kind"], d["metadata"]["name"]) for d in docs()}
    # the head mounts the Secret where the entrypoint reads the CA
    ops = {op["path"]: op for op in _tls_patch("raycluster.yaml")}
    (vol,) = ops["/spec/headGroupSpec/template/spec/volumes"]["value"]
    (mount,) = ops["/spec/headGroupSpec/template/spec/containers/0/volumeMounts"]["value"]
    assert vol["secret"]["secretName"] == TLS_SECRET and vol["name"] == mount["name"]
    # the entrypoint: the base one plus the TLS flags, accepted by `bubblespec ray up`
    (op,) = _tls_patch("rayjob.yaml")
    assert op["path"] == "/spec/entrypoint"
    base = one("RayJob")["spec"]["entrypoint"]
    assert op["value"].startswith(base + " ")
    args = parse_args(shlex.split(op["value"])[2:])
    assert args.tls and args.tls_ca.startswith(mount["mountPath"] + "/")
    assert args.tls_ca_key.startswith(mount["mountPath"] + "/")
    assert args.tls_host == ["bubblespec-head-svc"]
    # the PodMonitors scrape the HTTPS endpoints with the Secret's client certificate
    for name in ("podmonitor-head.yaml", "podmonitor-rank.yaml"):
        ops = {op["path"]: op["value"] for op in _tls_patch(name)}
        assert ops["/spec/podMetricsEndpoints/0/scheme"] == "https"
        tc = ops["/spec/podMetricsEndpoints/0/tlsConfig"]
        assert {tc["ca"]["secret"]["name"], tc["cert"]["secret"]["name"],
                tc["keySecret"]["name"]} == {TLS_SECRET}


def test_tls_overlay_builds_if_kubectl_available() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    out = run([kubectl, "kustomize", str(TLS_DIR)])
    assert out.returncode == 0, out.stderr
    built = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout) if d}
    head = built[("RayCluster", CLUSTER)]["spec"]["headGroupSpec"]["template"]["spec"]
    assert head["volumes"][0]["secret"]["secretName"] == TLS_SECRET
    assert "--tls" in shlex.split(built[("RayJob", "bubblespec-up")]["spec"]["entrypoint"])
    eps = {ep["port"]: ep for ep in
           built[("PodMonitor", "bubblespec-ray-head")]["spec"]["podMetricsEndpoints"]}
    assert eps["gateway"]["scheme"] == "https" and "scheme" not in eps["sync-metrics"]
