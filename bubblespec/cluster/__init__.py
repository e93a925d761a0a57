"""Running a whole bubblespec cluster (synchronizer, rank servers, gateway) as one unit.

`base.Cluster` is the interface callers rely on (addresses and lifetime); `local.LocalCluster`
runs every member as a child process on this host (`bubblespec up`, `bubblespec run`, the
benchmarks, the tests); `ray.RayCluster` runs them as Ray actors (`bubblespec ray up`; import
it from `bubblespec.cluster.ray`, which needs the `ray` extra).
"""

from bubblespec.cluster.base import Cluster, ClusterError
from bubblespec.cluster.local import LocalCluster, free_ports

__all__ = ["Cluster", "ClusterError", "LocalCluster", "free_ports"]
