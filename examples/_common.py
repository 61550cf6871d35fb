"""Where the examples find the service: ``--server``/``CASCADE_SERVER`` and ``--api-key``/``CASCADE_API_KEY``.

The OpenAI SDK needs an API key string even when the service has none configured, so the
examples send ``unused`` then (the service ignores the header unless it was started with a key).
"""

from __future__ import annotations

import argparse
import os

from openai import OpenAI


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser that already knows the connection options."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--server", default=os.environ.get("CASCADE_SERVER", "http://127.0.0.1:8000"),
                        help="service URL (env CASCADE_SERVER)")
    parser.add_argument("--api-key", default=os.environ.get("CASCADE_API_KEY") or "unused",
                        help="API key (env CASCADE_API_KEY)")
    parser.add_argument("--model", help="model name (default: the one the service serves)")
    return parser


def openai_client(args: argparse.Namespace) -> tuple[OpenAI, str]:
    """An OpenAI SDK client pointed at the service, and the model to ask for."""
    client = OpenAI(base_url=args.server.rstrip("/") + "/v1", api_key=args.api_key, max_retries=0, timeout=300)
    return client, args.model or client.models.list().data[0].id
