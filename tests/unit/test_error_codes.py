"""Every error names a code clients can branch on, also where the raiser gave none."""

from __future__ import annotations

from cascade.api.errors import error_body
from hypothesis import given
from hypothesis import strategies as st


@given(st.sampled_from([400, 401, 403, 404, 405, 408, 409, 413, 415, 422, 429, 431, 500, 503, 504, 599]),
       st.one_of(st.none(), st.text(min_size=1, max_size=8)))
def test_an_error_without_a_code_gets_one(status: int, param: str | None) -> None:
    error = error_body(status, "message", param)["error"]
    assert isinstance(error["code"], str) and error["code"]
    assert error["param"] == param


def test_a_400_naming_a_parameter_is_an_invalid_parameter_and_a_given_code_wins() -> None:
    assert error_body(400, "bad", "codec.top_k")["error"]["code"] == "invalid_parameter"
    assert error_body(400, "bad")["error"]["code"] == "invalid_request"
    assert error_body(400, "bad", "codec.data", "invalid_base64")["error"]["code"] == "invalid_base64"
