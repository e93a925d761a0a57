"""LocalCluster without engines: a child that dies during start stops the rest and is
reported with its log tail; ports are distinct; shutdown leaves nothing."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bubblespec.cluster import ClusterError, LocalCluster, free_ports


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie not yet reaped still answers kill(0): check its state
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split()[2] == "Z"


def test_free_ports_are_distinct() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20 and all(p > 0 for p in ports)


def test_child_dying_during_start_stops_everything(tmp_path: Path) -> None:
    c = LocalCluster(ranks=2, log_dir=tmp_path, model=str(tmp_path),
                     rank_args=["--no-such-flag"], start_timeout_s=60, grace_s=3)
    with pytest.raises(ClusterError) as e:
        c.start()
    msg = str(e.value)
    assert "exited with code 2 during start" in msg and "no-such-flag" in msg
    assert msg.split(" exited")[0] in ("r0", "r1")
    for child in c.children.values():
        if child.proc is not None:
            assert _gone(child.proc.pid), child.name
    assert (tmp_path / "sync.log").exists() and (tmp_path / "r0.log").exists()


@pytest.mark.engine
def test_engine_start_failure_fails_fast_with_the_reason(tmp_path: Path) -> None:
    c = LocalCluster(ranks=1, log_dir=tmp_path, model=str(tmp_path / "no-model"),
                     start_timeout_s=240, grace_s=5)
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match="r0: engine start failed"):
        c.start()
    assert time.monotonic() - t0 < 200
    assert all(_gone(ch.proc.pid) for ch in c.children.values() if ch.proc is not None)


def test_tls_plan_gives_every_child_the_throwaway_certificates(tmp_path: Path) -> None:
    c = LocalCluster(ranks=2, log_dir=tmp_path, model=str(tmp_path), tls=True)
    c._plan()  # no child started: the commands and files only
    pki = c.pki
    assert pki is not None and pki.ca.parent == tmp_path / "tls"
    assert pki.ca.is_file() and pki.cert.is_file() and pki.key.is_file()
    for name, child in c.children.items():
        cmd = child.argv
        for flag, path in (("--tls-cert", pki.cert), ("--tls-key", pki.key),
                           ("--tls-ca", pki.ca)):
            assert cmd[cmd.index(flag) + 1] == str(path), name
        assert "--tls-client-auth" in cmd, name
    assert c.gateway_url.startswith("https://")
    assert all(u.startswith("https://") for u in c.rank_urls.values())
    assert c.client_tls() == {"ca": str(pki.ca), "cert": str(pki.cert), "key": str(pki.key)}
    plain = LocalCluster(ranks=1, log_dir=tmp_path / "plain", model=str(tmp_path))
    plain._plan()
    assert plain.pki is None and plain.client_tls() == {}
    assert not any("--tls-ca" in ch.argv for ch in plain.children.values())
