"""services/*/Dockerfile: what can be checked without a Docker engine. Each image runs
`bubblespec <role>` with env settings the role's config accepts, copies only files that
exist and that .dockerignore lets through, and probes itself with `bubblespec health` on the
port it serves."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy.helpers import REPO, check_command

DOCKERFILES = {
    "services/synchronizer/Dockerfile": "sync",
    "services/rank/Dockerfile": "rank",
    "services/rank/Dockerfile.gpu": "rank",
    "services/gateway/Dockerfile": "gateway",
}


@dataclass
class Instr:
    op: str
    args: str


def parse(path: Path) -> list[Instr]:
    """Instructions of a Dockerfile (comments dropped, `\\` continuations joined)."""
    out: list[Instr] = []
    buf = ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        op, _, args = buf.strip().partition(" ")
        out.append(Instr(op.upper(), args.strip()))
        buf = ""
    assert not buf, f"{path}: dangling continuation"
    return out


def env_of(instrs: list[Instr]) -> dict[str, str]:
    env: dict[str, str] = {}
    for i in instrs:
        if i.op == "ENV":
            for tok in shlex.split(i.args):
                k, _, v = tok.partition("=")
                env[k] = v
    return env


def expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), ""), text)


def dockerignore_includes() -> set[str]:
    lines = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "*", ".dockerignore starts by excluding everything"
    return {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}


@pytest.mark.parametrize("rel", sorted(DOCKERFILES))
def test_dockerfile(rel: str) -> None:
    path = REPO / rel
    role = DOCKERFILES[rel]
    instrs = parse(path)
    ops = [i.op for i in instrs]
    assert ops[0] in ("ARG", "FROM") and "FROM" in ops
    assert set(ops) <= {"ARG", "FROM", "ENV", "WORKDIR", "COPY", "RUN", "USER", "EXPOSE",
                        "HEALTHCHECK", "ENTRYPOINT", "CMD", "LABEL"}, set(ops)
    # COPY: sources exist and the build context (.dockerignore) holds them
    allowed = dockerignore_includes()
    for i in instrs:
        if i.op == "COPY":
            *srcs, _dst = shlex.split(i.args)
            for src in srcs:
                if src.startswith("--"):
                    continue
                assert (REPO / src).exists(), f"{rel}: COPY {src}: missing"
                assert src.rstrip("/") in allowed, f"{rel}: {src} is excluded by .dockerignore"
    # the command: ENTRYPOINT bubblespec + CMD <role>, with the image's env
    (entry,) = [json.loads(i.args) for i in instrs if i.op == "ENTRYPOINT"]
    (cmd,) = [json.loads(i.args) for i in instrs if i.op == "CMD"]
    assert entry == ["bubblespec"] and cmd == [role], (entry, cmd)
    env = env_of(instrs)
    cfg = check_command(entry + cmd, env, where=rel)
    assert cfg.host == "0.0.0.0", f"{rel}: the image must listen on all interfaces"
    exposed = {int(p) for i in instrs if i.op == "EXPOSE" for p in i.args.split()}
    assert cfg.port in exposed, (cfg.port, exposed)
    # HEALTHCHECK: `bubblespec health` on that port
    (hc,) = [i.args for i in instrs if i.op == "HEALTHCHECK"]
    probe = shlex.split(expand(hc.split(" CMD ", 1)[1], env))
    assert probe[:2] == ["bubblespec", "health"], probe
    args = check_command(probe, where=f"{rel} HEALTHCHECK")
    if role == "sync":
        assert args.grpc == f"127.0.0.1:{cfg.port}"
        assert cfg.metrics_port in exposed
    else:
        assert args.http == f"http://127.0.0.1:{cfg.port}/health_generate"
    assert "--start-period" in hc and "--timeout" in hc


def test_rank_images() -> None:
    cpu = (REPO / "services/rank/Dockerfile").read_text()
    assert "download.pytorch.org/whl/cpu" in cpu, "torch comes from the PyTorch CPU index"
    assert re.search(r"pip install \"?\.\[cpu,serve\]", cpu)
    assert "pip uninstall -y torchvision torchaudio torchcodec" in cpu
    assert "VLLM_TARGET_DEVICE=cpu" in cpu
    gpu_instrs = parse(REPO / "services/rank/Dockerfile.gpu")
    (base,) = [i.args for i in gpu_instrs if i.op == "FROM"]
    assert base.startswith("vllm/vllm-openai:"), base
    gpu = (REPO / "services/rank/Dockerfile.gpu").read_text()
    assert "-c /tmp/keep.txt" in gpu, "torch and vllm of the base image stay pinned"
    assert "[cpu" not in gpu


def test_light_images_do_not_install_the_engine() -> None:
    for rel in ("services/synchronizer/Dockerfile", "services/gateway/Dockerfile"):
        text = (REPO / rel).read_text()
        assert "torch" not in text.lower().replace("no torch", "")
        assert ".[serve]" in text and "[cpu" not in text and "[gpu" not in text
        assert "USER 10001" in text, f"{rel}: runs as a non-root user"
