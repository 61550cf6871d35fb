"""``python3 -m cascade.healthcheck [URL]``: exit 0 when ``/ready`` answers 200, else 1.

Docker's HEALTHCHECK and the Kubernetes startup/readiness probes run this instead of a bare HTTP
GET because ``/ready`` needs the API key when one is set (``CASCADE_API_KEY``), and an
``httpGet`` probe cannot read a secret. Standard library only: it runs every few seconds.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8000/ready"


def ready(url: str = DEFAULT_URL, api_key: str | None = None, timeout: float = 4.0) -> bool:
    """Whether ``url`` answers 200, sending ``api_key`` as a bearer token when there is one."""
    request = urllib.request.Request(url)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return 0 if ready(args[0] if args else DEFAULT_URL, os.environ.get("CASCADE_API_KEY")) else 1


if __name__ == "__main__":
    sys.exit(main())
