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


def limits_table() -> int:
    """Print the README's Limits table from the settings fields and ``LIMITS``."""
    from cascade.settings import LIMITS, Settings

    print("| setting | env var | default | bounds | over the limit |")
    print("|---|---|---|---|---|")
    for name, what, answer in LIMITS:
        field = Settings.model_fields[name]
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
