"""RayCluster's plan without Ray running: bundles (N x tp, GPU or CPU-only), rank ports per
node, core binding, and the `bubblespec ray` command line."""

from __future__ import annotations

import pytest

from bubblespec.cli.ray import down_command, parse_args
from bubblespec.cluster import ClusterError
from bubblespec.cluster.ray import RayCluster
from bubblespec.cluster.ray_placement import cpu_binding, node_slots, plan_bundles


def test_bundles_are_ranks_times_tp_with_a_gpu_each_where_there_are_gpus() -> None:
    assert plan_bundles(2, 1, gpus=False, cpus_per_bundle=1) == [{"CPU": 1}, {"CPU": 1}]
    gpu = plan_bundles(3, 2, gpus=True, cpus_per_bundle=4)
    assert gpu == [{"CPU": 4, "GPU": 1}] * 6
    gpu[0]["GPU"] = 0  # bundles are distinct dicts
    assert gpu[1]["GPU"] == 1
    with pytest.raises(ValueError):
        plan_bundles(0, 1, gpus=False, cpus_per_bundle=1)


def test_bundle_resources_keep_ranks_on_the_nodes_that_have_them() -> None:
    assert plan_bundles(2, 1, gpus=False, cpus_per_bundle=1, extra={"worker": 1}) == [
        {"CPU": 1, "worker": 1}] * 2
    for bad in ({"CPU": 1}, {"GPU": 2}, {"worker": 0}):
        with pytest.raises(ValueError):
            plan_bundles(1, 1, gpus=False, cpus_per_bundle=1, extra=bad)
    up = parse_args(["up", "--bundle-resource", "worker=1", "--bundle-resource", "zone_a=0.5"])
    assert up.bundle_resources == {"worker": 1.0, "zone_a": 0.5}
    assert parse_args(["up"]).bundle_resources == {}
    for bad in ("worker", "worker=x", "worker=0", "=1", "CPU=1"):
        with pytest.raises(SystemExit):
            parse_args(["up", "--bundle-resource", bad])


def test_rank_ports_count_per_node() -> None:
    assert node_slots(["a", "b", "c"]) == [0, 0, 0]  # one rank per pod: all on the base port
    assert node_slots(["a", "a", "b", "a", "b"]) == [0, 1, 0, 2, 1]


def test_core_binding_like_local_cluster() -> None:
    assert cpu_binding(0, 2, 2) == {"VLLM_CPU_OMP_THREADS_BIND": "0"}
    assert cpu_binding(1, 2, 8) == {"VLLM_CPU_OMP_THREADS_BIND": "4-7"}
    assert cpu_binding(0, 4, 2) == {}  # fewer cores than ranks: vLLM's own choice


def test_tp_and_strategy_are_checked_before_ray_starts() -> None:
    with pytest.raises(ClusterError, match="tensor-parallel"):
        RayCluster(tp=2).start()
    with pytest.raises(ClusterError, match="strategy"):
        RayCluster(strategy="SIDEWAYS").start()


def test_ray_command_line() -> None:
    up = parse_args(["up", "--address", "auto", "--ranks", "4", "--strategy", "SPREAD",
                     "--gpus", "--detach"])
    assert (up.action, up.address, up.ranks, up.strategy, up.gpus, up.detach) == (
        "up", "auto", 4, "SPREAD", True, True)
    local = parse_args(["up"])
    assert local.address is None and local.gpus is None and local.gateway_port == 8000
    assert parse_args(["status"]).action == "status"
    assert parse_args(["down", "--name", "x"]).name == "x"
    placed = parse_args(["up", "--role-cpus", "0.25", "--wait-for-nodes-s", "120",
                         "--node-ip-address", "10.0.0.5"])
    assert (placed.role_cpus, placed.wait_for_nodes_s, placed.node_ip_address) == (
        0.25, 120.0, "10.0.0.5")
    assert (local.role_cpus, local.wait_for_nodes_s, local.node_ip_address) == (0.5, 0.0, None)
    for bad in (["up", "--detach"], ["up", "--ranks", "0"], ["up", "--strategy", "X"], [],
                ["up", "--role-cpus", "0"], ["up", "--wait-for-nodes-s", "-1"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
    tls = parse_args(["up", "--tls", "--tls-ca", "ca.pem", "--tls-cert", "c.pem",
                      "--tls-key", "k.pem"])
    assert tls.tls and (tls.tls_ca, tls.tls_cert, tls.tls_key) == ("ca.pem", "c.pem", "k.pem")
    assert parse_args(["up", "--tls"]).tls_ca is None
    issued = parse_args(["up", "--tls", "--tls-ca", "ca.pem", "--tls-ca-key", "ca-key.pem",
                         "--tls-host", "head-svc"])
    assert (issued.tls_ca_key, issued.tls_host) == ("ca-key.pem", ["head-svc"])
    for bad in (["up", "--tls-ca", "ca.pem"], ["up", "--tls", "--tls-cert", "c.pem"],
                ["up", "--tls", "--tls-ca-key", "k.pem"], ["up", "--tls-host", "x"],
                ["up", "--tls", "--tls-ca", "a", "--tls-ca-key", "b", "--tls-cert", "c"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_the_detach_hint_names_the_actors_it_started() -> None:
    plain = parse_args(["up", "--address", "auto", "--detach"])
    assert down_command(plain) == "bubblespec ray down --address auto"
    named = parse_args(["up", "--address", "auto", "--detach", "--name", "x",
                        "--namespace", "ns"])
    assert down_command(named) == "bubblespec ray down --address auto --name x --namespace ns"


def test_an_address_that_does_not_answer_fails_at_once() -> None:
    """`ray.init` retries a dead GCS address for many minutes; the start says so in seconds."""
    import socket
    import time

    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=f"Ray at 127.0.0.1:{port} .*does not answer"):
        RayCluster(address=f"127.0.0.1:{port}", model="unused").start()
    assert time.monotonic() - t0 < 30
