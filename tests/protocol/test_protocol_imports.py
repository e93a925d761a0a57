"""bubblespec.protocol imports only the stdlib, pydantic and numpy: no server framework,
gRPC or vLLM, and no other bubblespec package (every service imports it, not the reverse)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKED = ("torch", "vllm", "grpc", "fastapi", "starlette", "httpx", "uvicorn")

SCRIPT = textwrap.dedent(f"""
    import sys

    BLOCKED = {BLOCKED!r}

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"bubblespec.protocol imported blocked module {{name}}")
            return None

    sys.meta_path.insert(0, Block())
    from bubblespec.protocol import (domain, errors, gateway, keys, rank, sample,  # noqa
                                     sampling, sglang)

    ours = sorted(m for m in sys.modules if m.startswith("bubblespec.")
                  and m != "bubblespec.protocol" and not m.startswith("bubblespec.protocol."))
    assert not ours, ours
    print("clean")
""")


def run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)


def test_protocol_imports_only_light_dependencies() -> None:
    out = run(SCRIPT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "clean"


def test_the_blocker_blocks() -> None:
    """The guard itself must be able to fail: importing a blocked name raises."""
    out = run(SCRIPT.replace("from bubblespec.protocol import", "import grpc  # noqa\nfrom "
                             "bubblespec.protocol import"))
    assert out.returncode != 0 and "blocked module grpc" in out.stderr
