"""``cascade`` command: ``serve`` runs the gateway; client commands come from ``cascade_client``."""

from __future__ import annotations

import sys


def serve(argv: list[str]) -> int:
    """Run the gateway with uvicorn until SIGINT/SIGTERM; engines are shut down on the way out.

    SIGTERM/SIGINT drain in-flight requests (up to ``drain_seconds``) and exit 0; an engine failure
    exits 1 so a supervisor restarts the service.
    """
    import contextlib
    from collections.abc import Iterator

    import uvicorn

    class GracefulServer(uvicorn.Server):
        """uvicorn re-raises a handled SIGTERM after shutdown (exit status -15); a drained,
        clean shutdown should exit 0 instead."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                yield
                captured = getattr(self, "_captured_signals", None)
                if isinstance(captured, list):
                    captured.clear()

    from cascade.app import create_app
    from cascade.http_protocol import HeaderLimits, limited_protocol
    from cascade.logging_setup import configure_logging
    from cascade.settings import load_settings

    settings = load_settings(argv)
    configure_logging(settings.log_level, settings.log_json)
    app = create_app(settings)
    limits = HeaderLimits(settings.max_header_bytes, settings.max_headers, settings.header_timeout_seconds)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                            timeout_graceful_shutdown=int(settings.drain_seconds), access_log=False,
                            http=limited_protocol(limits))
    server = GracefulServer(config)
    server.run()
    return int(app.state.gateway.exit_code)


def config_table() -> int:
    """Print the configuration table (README) from the settings fields."""
    from cascade.settings import Settings

    print("| env var | flag | default | description |")
    print("|---|---|---|---|")
    for name, field in Settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        if name == "model":
            default = "models/pycoder-23m"
        flag = "--" + name.replace("_", "-")
        print(f"| `CASCADE_{name.upper()}` | `{flag}` | `{default}` | {field.description or ''} |")
    return 0


# Every dimension a request can inflate: (setting, what it bounds, how a request over it is answered).
LIMITS = [
    ("max_body_bytes", "request body of every route but the codec's", "413 `body_too_large`"),
    ("codec_max_input_bytes", "/compress and /decompress body (counted while streaming too)",
     "413 `body_too_large` / `input_too_large`"),
    ("max_model_len", "prompt tokens + max_tokens (k-CBS: prompt + steps)", "400 `context_length_exceeded`"),
    ("max_tokens_limit", "max_tokens / max_completion_tokens / codec.tokens", "400, param `max_tokens`"),
    ("max_n", "`n` choices per request", "400, param `n`"),
    ("max_stop_sequences", "stop strings", "400, param `stop`"),
    ("max_top_logprobs", "logprobs / top_logprobs", "400, param `logprobs`"),
    ("max_prediction_tokens", "prediction length in tokens (text checked before tokenising)",
     "400, param `prediction`"),
    ("max_kcbs_steps", "k-CBS T (steps); max_edit_distance ≤ T, target ≤ T + max_edit_distance tokens",
     "400, param `steps` / `max_edit_distance` / `target`"),
    ("max_kcbs_candidates", "k-CBS k² (candidates per step; k is also capped at 64)", "400, param `beam_width`"),
    ("codec_max_segments", "segments in a container", "400 `container_too_large`"),
    ("codec_max_output_bytes", "total original bytes a container declares", "400 `container_too_large`"),
    ("codec_max_context_bytes", "/compress context and a container's header context",
     "400, param `context` / `container_too_large`"),
    ("codec_lane_tokens", "default lane length (a request's lane_tokens ≥ 16, capped by the context)",
     "400, param `lane_tokens`"),
    ("codec_lanes", "default lanes per segment (a request's lanes, 1…64)", "400, param `lanes`"),
    ("codec_top_k", "default codec top-k (a request's top_k ≤ 1024 and < vocabulary)", "400, param `top_k`"),
    ("max_export_top_k", "top-k export's compression_top_k", "400"),
    ("max_export_values", "top-k export's positions × compression_top_k, summed over prompts",
     "400, param `compression_top_k`"),
    ("max_kcbs_rows", "k-CBS beam_width × steps (engine rows per search)", "400, param `steps`"),
    ("max_bad_words", "bad_words entries", "400, param `bad_words`"),
    ("max_word_chars", "characters of one stop string or bad word", "400, param `stop` / `bad_words`"),
    ("max_tokenize_chars", "/v1/tokenize text", "400, param `prompt`"),
    ("max_header_bytes", "total size of a request's headers", "431, connection closed"),
    ("max_headers", "header lines of a request", "431, connection closed"),
    ("header_timeout_seconds", "time to send the headers", "408, connection closed"),
    ("body_timeout_seconds", "total time spent waiting for the body", "408 `body_timeout`"),
    ("request_timeout_seconds", "a /v1 request from start to last byte", "504 `deadline_exceeded` (stream: "
     "error event with status 504)"),
    ("max_concurrent_requests", "requests in flight (/v1/*, /compress, /decompress)",
     "429 `overloaded` + `Retry-After`"),
]


def limits_table() -> int:
    """Print the README's Limits table from the same settings fields."""
    from cascade.settings import Settings

    print("| setting | env var | default | bounds | over the limit |")
    print("|---|---|---|---|---|")
    for name, what, answer in LIMITS:
        field = Settings.model_fields.get(name)
        if field is None:  # a limit whose setting this build does not have
            continue
        flag = "--" + name.replace("_", "-")
        print(f"| `{flag}` | `CASCADE_{name.upper()}` | `{field.get_default()}` | {what} | {answer} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args else "--help"
    if command == "serve":
        return serve(args)
    if command == "config-table":
        return limits_table() if "--limits" in args else config_table()
    from cascade_client.cli import main as client_main

    return client_main([command, *args])


if __name__ == "__main__":
    sys.exit(main())
