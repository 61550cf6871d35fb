"""Hypothesis fuzz of every request model against its route on the live service: whatever the body,
the answer is never a 5xx (nor a stream error event with a 5xx status).

``CASCADE_FUZZ_EXAMPLES`` sets the cases per route (default 150; the soak figures used 2,500 per
route, 10,000 in all)."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import httpx
import pytest
from cascade.api.kcbs_routes import KcbsRequest
from cascade.api.openai_protocol import ChatCompletionRequest, CompletionRequest, TokenizeRequest
from hypothesis import HealthCheck, given, settings
from pydantic import BaseModel

from tests.integration.conftest import MODEL, Service
from tests.integration.fuzz_strategies import request_bodies

EXAMPLES = int(os.environ.get("CASCADE_FUZZ_EXAMPLES", "150"))
ROUTES: dict[str, type[BaseModel]] = {"/v1/chat/completions": ChatCompletionRequest,
                                      "/v1/completions": CompletionRequest, "/v1/kcbs": KcbsRequest,
                                      "/v1/tokenize": TokenizeRequest}


def _bounded(path: str, body: Any) -> Any:
    """A missing or null max_tokens means "up to the context": keep valid cases cheap."""
    if (path.endswith("completions") and isinstance(body, dict) and body.get("max_tokens") is None
            and body.get("max_completion_tokens") is None):
        return {**body, "max_tokens": 3}
    return body


def _server_errors(r: httpx.Response) -> list[str]:
    if r.status_code >= 500:
        return [f"{r.status_code}: {r.text[:300]}"]
    found = []
    for line in r.text.splitlines() if r.headers.get("content-type", "").startswith("text/event-stream") else []:
        if line.startswith("data: {") and '"error"' in line:
            status = json.loads(line[6:]).get("error", {}).get("status", 0)
            if status >= 500:
                found.append(line[:300])
    return found


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_fuzzed_request_bodies_never_get_a_5xx(service: Service, path: str) -> None:
    statuses: Counter[int] = Counter()
    with service.client() as client:

        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(body=request_bodies(ROUTES[path], {"model": MODEL}))
        def check(body: Any) -> None:
            r = client.post(path, content=json.dumps(_bounded(path, body)).encode(),
                            headers={"content-type": "application/json"})
            statuses[r.status_code] += 1
            assert not _server_errors(r), (body, _server_errors(r))

        check()
    print(f"{path}: {sum(statuses.values())} bodies, statuses {dict(sorted(statuses.items()))}")
    assert sum(statuses.values()) >= EXAMPLES
