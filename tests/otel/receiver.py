"""A local OTLP/HTTP receiver: decodes the protobuf bodies the exporters send."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class Receiver:
    def __init__(self) -> None:
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.headers: list[dict[str, str]] = []
        self.refuse = False
        self.url = ""

    def spans(self) -> list[Any]:
        return [s for r in self.traces for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]

    def histogram_points(self, name: str) -> list[Any]:
        return [
            p
            for r in self.metrics
            for rm in r.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == name
            for p in m.histogram.data_points
        ]


def attrs(item: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in item.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = [x.string_value for x in v.array_value.values] if kind == "array_value" else getattr(v, kind)
    return out


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if receiver.refuse:
                self.send_response(400)
                self.end_headers()
                return
            receiver.headers.append(dict(self.headers))
            if self.path == "/v1/traces":
                receiver.traces.append(ExportTraceServiceRequest.FromString(body))
            elif self.path == "/v1/metrics":
                receiver.metrics.append(ExportMetricsServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
