"""Generated protobuf/gRPC modules of the `bubblespec.rpc.v1` package (checked in)."""
