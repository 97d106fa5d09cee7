"""Prometheus metrics of one webhook app, in a registry of its own (several apps can share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Admission latency is sub-millisecond to a few ms; the apiserver gives up at timeoutSeconds (≤ 5 s for nodes).
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class WebhookMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        prefix = "machine_preservation_webhook"
        self.requests = Counter(
            f"{prefix}_requests", "Admission requests received, by endpoint.", ["endpoint"], registry=self.registry
        )
        self.denials = Counter(
            f"{prefix}_denials", "Admission requests denied, by endpoint.", ["endpoint"], registry=self.registry
        )
        self.patches = Counter(
            f"{prefix}_patches",
            "Admission responses carrying a patch, by endpoint.",
            ["endpoint"],
            registry=self.registry,
        )
        self.errors = Counter(
            f"{prefix}_errors",
            "Requests that could not be judged, by endpoint and kind "
            "(bad_request, too_large, timeout, upstream, internal).",
            ["endpoint", "kind"],
            registry=self.registry,
        )
        self.latency = Histogram(
            f"{prefix}_request_duration_seconds",
            "Time from receiving a request to answering it, by endpoint.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.certificate_expiry = Gauge(
            f"{prefix}_certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate in use, as a Unix timestamp (0 until one is loaded).",
            registry=self.registry,
        )
        self.certificate_reloads = Counter(
            f"{prefix}_certificate_reloads",
            "Attempts to load a changed serving certificate, by result (loaded, rejected).",
            ["result"],
            registry=self.registry,
        )
        self.connections = Gauge(
            f"{prefix}_connections",
            "Client connections open now (accepted and not yet closed, TLS handshakes included), by listener "
            "(seed: the seed's Machine webhooks; shoots: every shoot's node webhooks; all: both on one port).",
            ["listener"],
            registry=self.registry,
        )
        self.connections_dropped = Counter(
            f"{prefix}_connections_dropped",
            "Client connections the webhook closed itself, by listener and reason (limit, peer_limit: refused, "
            "every open connection (of its peer) was busy with a request; evicted: closed to make room before it "
            "had sent a request; evicted_idle: the least recently used kept-alive connection, closed to make room; "
            "header_timeout: TLS handshake and first request head not done in time; tls_handshake: failed "
            "handshake).",
            ["listener", "reason"],
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
