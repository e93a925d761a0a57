"""The one typed vocabulary every bubblespec service speaks.

Everything that crosses a process boundary is declared here once: sampling parameters
(`sampling`), the rank's and the gateway's HTTP bodies (`rank`, `gateway`), the domain types
the synchronizer, the ranks and the gateway exchange (`domain`), the prompt key and the
engine request-id codec (`keys`), and the error types (`errors`). Only the stdlib, pydantic
and numpy are imported here, never a server framework, gRPC or vLLM: converters to the wire
live at the protobuf boundary (`synchronizer/convert.py`) and at the vLLM boundary
(`engine/sampling.py`).
"""
