"""Adapters that let RL training frameworks use bubblespec as their rollout backend.

Each sub-package speaks one framework's own interfaces and maps them onto the gateway's
step API (`bubblespec.client`), so a framework keeps its training loop and only its rollout
backend changes. `verl`: a rollout replica, server actor, weight-sync adapter and next-batch
hook for verl 0.9 (`actor_rollout_ref.rollout.name=bubblespec`).
"""
