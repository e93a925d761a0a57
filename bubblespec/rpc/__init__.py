"""gRPC API of bubblespec: `v1` holds the code generated from `proto/bubblespec/rpc/v1/*.proto`.

Regenerate with `bubblespec proto` (what `make proto` runs); never edit the
generated `*_pb2*.py(i)` files by hand.
"""
