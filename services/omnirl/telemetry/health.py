"""The standard gRPC health service (grpc.health.v1), for Kubernetes gRPC probes.

Readiness is set by the role (`set_serving`); liveness follows the role's main loop: with
`set_liveness(check)`, every Check answers NOT_SERVING while `check()` is false (the loop has not
beaten for `failurePolicy.progressDeadlineSeconds`), so the kubelet's liveness probe restarts a
hung role — a thread answering probes alone does not keep it alive.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from omnirl.api.runtime import port_errors


class _LiveHealthServicer(health.HealthServicer):
    """HealthServicer whose SERVING answers are vetoed by a liveness check."""

    def __init__(self) -> None:
        super().__init__()
        self.live: Callable[[], bool] = lambda: True

    def Check(self, request, context):  # noqa: N802 - the gRPC method name
        reply = super().Check(request, context)
        if reply.status == health_pb2.HealthCheckResponse.SERVING and not self.live():
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING)
        return reply


class HealthServer:
    """Serves `grpc.health.v1.Health` on `port` ("" service = the whole role).

    Args:
        port: TCP port (0 picks a free one; see `.port`).
    Raises:
        ConfigError: `port` cannot be served (another process listens on it, e.g. a second role with
            the same OMNIRL_HEALTH_PORT on one host): the role exits 4 with one line naming the
            variable, not a traceback and restarts.
    """

    def __init__(self, port: int) -> None:
        self.servicer = _LiveHealthServicer()
        # grpc sets SO_REUSEPORT by default: a second role's server on the same port bound without an
        # error and the kubelet's probes went to either process
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, self.server)
        with port_errors("health_port", port, serves="gRPC health probes"):
            try:
                self.port = self.server.add_insecure_port(f"[::]:{port}")
            except RuntimeError as err:  # grpc's text sends the reader to GRPC_VERBOSITY; its log line has the errno
                raise OSError(f"cannot listen on [::]:{port} (taken by another process, or below 1024 without the "
                              "privilege)") from err
        self.server.start()
        self.set_serving(False)

    def set_serving(self, serving: bool) -> None:
        """SERVING once the role is ready; NOT_SERVING while it starts or after it failed."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        self.servicer.set("", status)

    def set_liveness(self, check: Callable[[], bool]) -> None:
        """`check()` → False makes every Check answer NOT_SERVING (called on each probe; keep it cheap)."""
        self.servicer.live = check

    def stop(self) -> None:
        """Stop serving at once."""
        self.server.stop(grace=None)
