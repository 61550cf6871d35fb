"""The ``check`` of encode-while-sampling objects: its exact layout, and what decode mode refuses."""

from __future__ import annotations

import hashlib
import struct
from types import SimpleNamespace
from typing import Any

import pytest
from cascade.codec.sampling_codec import ReplayMismatchError, check_identity, check_tokens, ids_sha256, replay_check

CODEC: Any = SimpleNamespace(fingerprint=bytes(range(32)), numerics="exact-llama-1")
PROMPT = [1, 822, 1966, 8191]
TOKENS = [0, 4294967295, 17]


def test_token_ids_are_hashed_as_u32_little_endian() -> None:
    assert ids_sha256(TOKENS) == hashlib.sha256(b"\0\0\0\0" + b"\xff\xff\xff\xff" + b"\x11\0\0\0").hexdigest()
    assert ids_sha256([]) == hashlib.sha256(b"").hexdigest()
    assert ids_sha256(PROMPT) == hashlib.sha256(struct.pack("<4I", *PROMPT)).hexdigest()


def test_the_check_records_model_numerics_prompt_and_tokens() -> None:
    assert replay_check(CODEC, PROMPT, TOKENS) == {
        "version": 1, "model": bytes(range(32)).hex(), "numerics": "exact-llama-1",
        "prompt_sha256": ids_sha256(PROMPT), "tokens_sha256": ids_sha256(TOKENS)}


def _check(**changes: Any) -> Any:
    return SimpleNamespace(**{**replay_check(CODEC, PROMPT, TOKENS), **changes})


def test_a_matching_check_passes() -> None:
    check_identity(_check(), CODEC, PROMPT)
    check_tokens(_check(), TOKENS)


@pytest.mark.parametrize(("check", "prompt", "status", "code"), [
    (_check(numerics="exact-llama-2"), PROMPT, 409, "numerics_mismatch"),
    (_check(numerics="exact-llama-2", model="0" * 64), [9], 409, "numerics_mismatch"),
    (_check(model="0" * 64), PROMPT, 409, "model_mismatch"),
    (_check(), [*PROMPT, 5], 422, "replay_mismatch"),
    (_check(), PROMPT[1:], 422, "replay_mismatch"),
])
def test_identity_mismatches_are_refused_before_decoding(check: Any, prompt: list[int], status: int,
                                                         code: str) -> None:
    with pytest.raises(ReplayMismatchError) as caught:
        check_identity(check, CODEC, prompt)
    assert (caught.value.status, caught.value.code) == (status, code)


@pytest.mark.parametrize("tokens", [TOKENS[:-1], [*TOKENS, 0], [1, 4294967295, 17], []])
def test_other_decoded_tokens_are_a_422(tokens: list[int]) -> None:
    with pytest.raises(ReplayMismatchError) as caught:
        check_tokens(_check(), tokens)
    assert (caught.value.status, caught.value.param) == (422, "codec.data")
