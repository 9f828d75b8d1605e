"""The standard gRPC health service (grpc.health.v1), for Kubernetes gRPC probes."""

from __future__ import annotations

from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


class HealthServer:
    """Serves `grpc.health.v1.Health` on `port` ("" service = the whole role).

    Args:
        port: TCP port (0 picks a free one; see `.port`).
    """

    def __init__(self, port: int) -> None:
        self.servicer = health.HealthServicer()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, self.server)
        self.port = self.server.add_insecure_port(f"[::]:{port}")
        self.server.start()
        self.set_serving(False)

    def set_serving(self, serving: bool) -> None:
        """SERVING once the role is ready; NOT_SERVING while it starts or after it failed."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        self.servicer.set("", status)

    def stop(self) -> None:
        """Stop serving at once."""
        self.server.stop(grace=None)
