"""bubblespec.core must stay importable and usable without torch, vllm, grpc or fastapi."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKED = ("torch", "vllm", "grpc", "fastapi")

SCRIPT = textwrap.dedent(f"""
    import sys

    BLOCKED = {BLOCKED!r}

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"bubblespec.core imported blocked module {{name}}")
            return None

    sys.meta_path.insert(0, Block())
    import bubblespec.core as core
    from bubblespec.core import (  # noqa
        automaton, draft, engine_time, matcher, reference, suffix_index)

    idx = core.SuffixIndex(max_depth=8)
    idx.add_sequence(0, "g", [1, 2, 3, 4])
    assert idx.draft("g", [1, 2], core.DraftParams(max_spec_factor=2.0)).token_ids == [3, 4]
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not loaded, loaded
    print("clean")
""")


def test_core_imports_without_heavy_dependencies():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "clean"


def test_the_blocker_blocks():
    """The guard itself must be able to fail: importing a blocked name raises."""
    probe = SCRIPT.replace("import bubblespec.core as core", "import grpc  # noqa")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode != 0 and "blocked module grpc" in out.stderr
