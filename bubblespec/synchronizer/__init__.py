"""The synchronizer: gRPC daemon (step state, stop signal, pre-generation queue, draft store,
timeline) and its async client.

`SyncClient` and the plain types are what ranks and the gateway import; the daemon is started
with `bubblespec sync` (`bubblespec.synchronizer.server.main`).
"""
