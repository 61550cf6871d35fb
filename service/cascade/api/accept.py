"""Whether a request's ``Accept`` header asks for a media type (RFC 9110 §12.5.1, without wildcards).

Every ``Accept`` line counts (HTTP joins repeated lines with commas). Only exact types select a reply format
here (``*/*`` keeps the route's default), matched case-insensitively, and a type listed with ``q=0`` is
refused, not asked for.
"""

from __future__ import annotations

from starlette.requests import Request


def accepts(request: Request, media_type: str) -> bool:
    """Whether ``media_type`` is listed in ``Accept`` with a quality above zero."""
    wanted = media_type.lower()
    for entry in ",".join(request.headers.getlist("accept")).split(","):
        kind, *parameters = (part.strip() for part in entry.split(";"))
        if kind.lower() != wanted:
            continue
        quality = next((value for key, _, value in (p.partition("=") for p in parameters)
                        if key.strip().lower() == "q"), "1")
        try:
            return float(quality) > 0
        except ValueError:
            return True
    return False
