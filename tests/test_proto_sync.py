"""The checked-in `bubblespec/rpc/v1/*_pb2*.py(i)` equal a fresh generation from the .proto files.

Fails after editing a .proto without `make proto` (bubblespec proto), after a
hand edit of generated code, or when the installed grpcio-tools is not the pinned one.
"""

from __future__ import annotations

import pytest

pytest.importorskip("grpc_tools")

from bubblespec.rpc import gen


def test_generated_code_is_fresh() -> None:
    assert gen.proto_files(), "no .proto files found"
    problems = gen.stale_files()
    assert not problems, "stale generated code (run `make proto`):\n" + "\n".join(problems)


def test_generated_imports_are_absolute_package_imports() -> None:
    text = (gen.REPO_ROOT / gen.PACKAGE_DIR / "synchronizer_pb2_grpc.py").read_text()
    assert "from bubblespec.rpc.v1 import synchronizer_pb2" in text
