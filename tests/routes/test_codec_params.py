"""/compress parameters: one typing rule for JSON and the query string, 400s that name the parameter.

The route tier's service has the codec off, so a request whose parameters are valid gets the codec's
503; a request with a bad parameter gets its 400 before that.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.routes.conftest import FakeService

TEXT = {"content-type": "text/plain"}


@pytest.mark.parametrize(("query", "param"), [
    ("lanes=%C2%B2", "lanes"), ("top_k=%C2%B2", "top_k"), ("lane_tokens=%C2%B2", "lane_tokens"),
    ("precision_bits=%C2%B2", "precision_bits"), ("segment_tokens=%C2%B2", "segment_tokens"),
    ("lanes=%D9%A1%D9%A2", "lanes"), ("top_k=%EF%BC%98", "top_k"), ("lanes=8.0", "lanes"), ("lanes=", "lanes"),
    ("lanes=%2B8", "lanes"), ("lanes=1e3", "lanes"), ("lanes=9" * 1 + "9" * 30, "lanes"),
    ("verify=banana", "verify"), ("verify=", "verify"), ("verify=truee", "verify"), ("lanes=65", "lanes"),
    ("precision_bits=12", "precision_bits"), ("unknown=1", "unknown"), ("top_k=abc&top_k=5", "top_k"),
    ("lanes=8&lanes=8", "lanes"), ("context=%FF", "context"), ("context=%ED%A0%80", "context"), ("lanes=%ff", "lanes"),
    ("%ff=1", None),
    ("lane_tokens=32&segment_tokens=64", "segment_tokens"), ("=", None), ("=1", None),
])
def test_a_bad_query_parameter_is_a_400_naming_it_and_its_code(fake_service: FakeService, query: str,
                                                                 param: str | None) -> None:
    with fake_service.client() as client:
        r = client.post(f"/compress?{query}", content=b"x", headers=TEXT)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert isinstance(r.json()["error"]["code"], str) and r.json()["error"]["code"]


@pytest.mark.parametrize("query", ["lanes=8", "lanes=08", "verify=TRUE", "verify=no", "verify=1", "verify=Yes",
                                   "precision_bits=24&top_k=16&lane_tokens=32", "segment_tokens=64"])
def test_a_well_formed_query_passes_validation(fake_service: FakeService, query: str) -> None:
    with fake_service.client() as client:
        r = client.post(f"/compress?{query}", content=b"x", headers=TEXT)
    assert r.status_code == 503, r.text


@pytest.mark.parametrize(("field", "value"), [
    ("lanes", "8"), ("precision_bits", "32"), ("top_k", "16"), ("lane_tokens", 32.0), ("lanes", True),
    ("verify", "true"), ("verify", 1), ("verify", "banana"), ("lanes", "²"), ("precision_bits", 16.0),
    ("precision_bits", True), ("top_k", 5.0),
])
def test_json_values_must_have_their_json_type(fake_service: FakeService, field: str, value: Any) -> None:
    with fake_service.client() as client:
        r = client.post("/compress", json={"text": "x", field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


def test_json_values_of_the_right_type_pass_validation(fake_service: FakeService) -> None:
    with fake_service.client() as client:
        r = client.post("/compress", json={"text": "x", "lanes": 8, "precision_bits": 32, "top_k": 16,
                                           "lane_tokens": 32, "verify": True, "context": "# c\n"})
    assert r.status_code == 503, r.text


def test_query_parameters_beside_a_json_body_are_a_400_not_ignored(fake_service: FakeService) -> None:
    with fake_service.client() as client:
        r = client.post("/compress?top_k=abc", json={"text": "x"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "top_k"


@pytest.mark.parametrize(("body", "param"), [({"data": "AAAA", "x": 1}, "x"), ({"data": "AAAA", "model": 3}, "model"),
                                             ({"data": 5}, "data"), ({}, "data")])
def test_a_bad_decompress_json_field_is_a_400_naming_it(fake_service: FakeService, body: dict[str, Any],
                                                        param: str) -> None:
    with fake_service.client() as client:
        r = client.post("/decompress", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_codec_completion_on_a_service_without_the_codec_is_a_400_with_its_code(fake_service: FakeService) -> None:
    """Every error names its code: the codec 400s of /v1/completions too (they carried ``"code": null``)."""
    settings = fake_service.gateway.settings
    with fake_service.client() as client:
        r = client.post("/v1/completions", json={"model": settings.model_name, "prompt": "x", "max_tokens": 2,
                                                 "codec": {"mode": "encode"}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "codec_disabled" and r.json()["error"]["param"] == "codec"


@pytest.mark.parametrize(("body", "param"), [
    ('{"text": "\\ud800"}', "text"), ('{"text": "x", "context": "a\\udfffb"}', "context"),
    ('{"text": "x", "lane_tokens": 32, "segment_tokens": 64}', "segment_tokens"), ('{"text": ', None),
    ('[1, 2]', None), ('{"text": "x", "lanes": 8, "lanes": 4}', "lanes"),
])
def test_a_bad_compress_json_body_is_a_400_naming_the_field(fake_service: FakeService, body: str,
                                                            param: str | None) -> None:
    with fake_service.client() as client:
        r = client.post("/compress", content=body.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"], error


@pytest.mark.parametrize(("query", "param"), [("bogus=1", "bogus"), ("lanes=-5", "lanes"),
                                              ("model=3&model=3", "model")])
def test_decompress_refuses_query_parameters_it_does_not_take(fake_service: FakeService, query: str,
                                                              param: str) -> None:
    with fake_service.client() as client:
        raw = client.post(f"/decompress?{query}", content=b"CZ", headers={"content-type": "application/octet-stream"})
        beside_json = client.post(f"/decompress?{query}", json={"data": "AAAA"})
    for r in (raw, beside_json):
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param and r.json()["error"]["code"]


def test_decompress_takes_the_model_in_its_query_and_checks_it(fake_service: FakeService) -> None:
    with fake_service.client() as client:
        r = client.post("/decompress?model=gpt-17", content=b"CZ", headers={"content-type": "application/octet-stream"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
