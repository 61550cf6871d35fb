"""Request text is bounded by its length in characters before it is tokenised, and tokenised off the
event loop.

Tokenising is gateway CPU work that grows with the input (a 10 MB prompt took 108 s to be refused
after tokenising it; a 2 MB k-CBS target tokenised on the event loop froze every request for 3 s).
No token covers more than ``max_chars_per_token`` characters, so text longer than
``tokens × max_chars_per_token`` cannot fit in ``tokens`` and is refused from its length alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

from cascade.api.errors import APIError
from cascade.api.openai_protocol import SamplingFields
from cascade.export.token_table import max_chars_per_token
from cascade.settings import Settings

INLINE_TOKENIZE_CHARS = 10_000


def _bound(tokenizer: Any) -> int:
    bound: int | None = getattr(tokenizer, "_cascade_max_chars_per_token", None)
    if bound is None:
        bound = max_chars_per_token(tokenizer)
        tokenizer._cascade_max_chars_per_token = bound
    return bound


def check_fits(chars: int, tokens: int, tokenizer: Any, param: str, what: str = "the context") -> None:
    """400 when ``chars`` characters cannot be ``tokens`` tokens or fewer (checked before tokenising)."""
    per_token = _bound(tokenizer)
    if chars > tokens * per_token:
        raise APIError(400, f"{param} has {chars} characters; {what} holds {tokens} tokens and no token of this "
                            f"model covers more than {per_token} characters", param=param,
                       code="context_length_exceeded")


async def tokenize(tokenizer: Any, text: str, add_special_tokens: bool = False) -> list[int]:
    """Token ids of ``text``; anything but short text is tokenised in a worker thread."""
    if len(text) > INLINE_TOKENIZE_CHARS:
        ids = await asyncio.to_thread(tokenizer.encode, text, add_special_tokens=add_special_tokens)
    else:
        ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return list(ids)


def check_words(request: SamplingFields, settings: Settings) -> None:
    """Stop strings and bad words are matched or tokenised per request in the gateway: bound them."""
    stops = request.stop_sequences()
    bad_words = request.bad_words or []
    if len(bad_words) > settings.max_bad_words:
        raise APIError(400, f"At most {settings.max_bad_words} bad_words are allowed", param="bad_words")
    for param, words in (("stop", stops), ("bad_words", bad_words)):
        if any(len(word) > settings.max_word_chars for word in words):
            raise APIError(400, f"each of {param} may be at most {settings.max_word_chars} characters", param=param)
