"""Prometheus metrics operators watch; one registry per app so tests can build many apps."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass
class Metrics:
    """Every metric Cascade exports, created against one registry."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter("cascade_http_requests", "HTTP requests", ["route", "method", "status"],
                                registry=r)
        self.latency = Histogram("cascade_http_request_duration_seconds", "HTTP request latency", ["route"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.inflight = Gauge("cascade_inflight_requests", "Requests being served", registry=r)
        self.ttft = Histogram("cascade_time_to_first_token_seconds", "Time to first token", ["endpoint"],
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("cascade_prompt_tokens", "Prompt tokens processed", ["endpoint"],
                                     registry=r)
        self.completion_tokens = Counter("cascade_completion_tokens", "Tokens generated", ["endpoint"],
                                         registry=r)
        self.engine_unfinished = Gauge("cascade_engine_unfinished_requests",
                                       "Requests queued or running in an engine", ["engine"], registry=r)
        self.kcbs_steps = Counter("cascade_kcbs_beam_steps", "k-CBS and use_beam_search steps run", registry=r)
        self.export_positions = Counter("cascade_export_positions", "Prompt positions exported as top-k "
                                        "distributions", registry=r)
        self.accepted_prediction_tokens = Counter("cascade_accepted_prediction_tokens",
                                                  "Predicted tokens accepted by the engine", registry=r)
        self.rejected_prediction_tokens = Counter("cascade_rejected_prediction_tokens",
                                                  "Predicted tokens proposed but rejected", registry=r)
        self.codec_tokens = Counter("cascade_codec_tokens", "Tokens coded by the codec", ["direction"],
                                    registry=r)
        self.codec_bits = Counter("cascade_codec_bits", "Bits the codec emitted for coded tokens", registry=r)
        self.codec_bytes_in = Counter("cascade_codec_input_bytes", "Bytes given to /compress", registry=r)
        self.codec_bytes_out = Counter("cascade_codec_output_bytes", "Container bytes produced", registry=r)
        self.codec_errors = Counter("cascade_codec_errors", "Codec requests that failed", ["kind"], registry=r)
        self.codec_bits_per_token = Histogram("cascade_codec_bits_per_token", "Bits per token of a compress call",
                                              buckets=(0.5, 1, 1.5, 2, 3, 4, 6, 8, 12, 16), registry=r)
        self.codec_ratio = Histogram("cascade_codec_compression_ratio", "Input bytes / container bytes",
                                     buckets=(1, 1.5, 2, 3, 4, 6, 8, 12, 16), registry=r)
        self.engine_ready = Gauge("cascade_engine_ready", "1 when every engine is up", registry=r)
        self.engine_live_state = Gauge("cascade_engine_live_state", "Per-request state held inside an engine's "
                                       "worker (refreshed on scrape)", ["engine", "kind"], registry=r)
        self.kcbs_live_searches = Gauge("cascade_kcbs_live_searches", "k-CBS and use_beam_search searches running",
                                        registry=r)
        self.stored_responses = Gauge("cascade_stored_responses_bytes", "Bytes the Responses API's stored "
                                      "responses hold (bounded by stored_responses_bytes)", registry=r)
        self.engine_aborts = Gauge("cascade_engine_aborted_requests", "Engine requests aborted because the "
                                   "client left (cumulative since start)", registry=r)
        self.codec_live_jobs = Gauge("cascade_codec_live_jobs", "Exact-codec segment jobs queued or running",
                                     registry=r)
