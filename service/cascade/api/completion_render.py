"""Completions and chat completions in OpenAI's shapes: envelopes, choices, logprobs, usage."""

from __future__ import annotations

import codecs
import itertools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from cascade.api.openai_protocol import SamplingFields
from cascade.api.predictions import PredictionUsage
from cascade.engine.types import CompletionDelta, TokenLogprobs
from cascade.export.token_table import TokenTable

Kind = Literal["chat", "completion"]


@dataclass
class Choice:
    """One choice being assembled from engine deltas."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    characters: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    counter: TokenCharacters | None = None

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    def add(self, delta: CompletionDelta, top_n: int | None, kind: Kind, table: TokenTable | None = None,
            as_ids: bool = False) -> None:
        self.text += delta.text
        self.token_ids += delta.token_ids
        self.logprobs += logprob_entries(delta, top_n, kind, table, as_ids)
        if self.counter is None:
            self.counter = TokenCharacters(table)
        self.characters += self.counter.count(delta, top_n)
        if delta.finish_reason is not None:
            self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason


LOGPROB_FLOOR = -9999.0


def token_spelling(data: bytes) -> str:
    """A token's text; bytes that are not UTF-8 on their own (part of a character) are spelled as
    OpenAI's legacy completions spell them, ``bytes:\\xe6\\x97``, so distinct tokens keep distinct
    names (``top_logprobs`` keys) and the ``bytes`` field still holds the real bytes."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


def _top_entry(token_id: int, decoded: str, logprob: float, table: TokenTable | None,
               as_ids: bool = False) -> dict[str, Any]:
    """A token and its log-probability; a token the request's grammar ruled out (−inf: vLLM applies the
    grammar's mask before it takes log-probabilities, ``allowed_token_ids`` after) shows as −9999.0,
    OpenAI's floor, because JSON has no infinity.

    The engine's spelling is kept when it is the token's own whole text. A token holding part of a
    character is ``""`` to the engine when it starts the character and the whole character when it
    ends it; such a token is named by its own bytes (the token table's), so ``bytes`` joined over the
    answer are its text and distinct tokens keep distinct names. ``as_ids`` (vLLM's
    ``return_tokens_as_token_ids``) names every token ``token_id:<id>`` instead."""
    own = table.data(token_id) if table is not None else b""
    if decoded and "\ufffd" not in decoded and (not own or _utf8(own)):
        token, data = decoded, decoded.encode("utf-8")
    else:
        token, data = token_spelling(own), own
    if as_ids:
        token = f"token_id:{token_id}"
    return {"token": token, "logprob": max(logprob, LOGPROB_FLOOR), "bytes": list(data)}


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _entry(position: TokenLogprobs, top_n: int, kind: Kind, table: TokenTable | None,
           as_ids: bool = False) -> dict[str, Any]:
    """Chat's ``top_logprobs`` are the ``top_n`` best; completions' also hold the sampled token
    (OpenAI's legacy rule, so ``logprobs: 0`` still shows it)."""
    best = [c for c in position.candidates[:top_n] if kind == "chat" or c.token_id != position.token_id]
    if kind == "completion":
        chosen = next(c for c in position.candidates if c.token_id == position.token_id)
        best = sorted([*best, chosen], key=lambda c: -c.logprob)
    entry = _top_entry(position.token_id, position.token, position.logprob, table, as_ids)
    entry["top_logprobs"] = [_top_entry(c.token_id, c.token, c.logprob, table, as_ids) for c in best]
    return entry


def logprob_entries(delta: CompletionDelta, top_n: int | None, kind: Kind,
                    table: TokenTable | None = None, as_ids: bool = False) -> list[dict[str, Any]]:
    """OpenAI per-token entries for a delta (none when logprobs were not asked for); ``table`` spells
    tokens the engine could not decode alone."""
    if top_n is None or delta.logprobs is None:
        return []
    return [_entry(position, top_n, kind, table, as_ids) for position in delta.logprobs]


def prompt_entries(prompt: Sequence[int], text: str, positions: Sequence[TokenLogprobs], top_n: int,
                   table: TokenTable, as_ids: bool = False) -> tuple[list[dict[str, Any]], list[int]]:
    """An echoed prompt's logprob entries and their characters, as OpenAI's legacy completions give
    them: the first token has nothing to be predicted from, so its logprob and top_logprobs are null.

    The characters are counted on the echoed ``text`` itself: each token's bytes decoded in sequence
    (a token ending inside a character adds none, the one completing it adds it) and matched where
    the text continues; a token the text does not show (a BOS the tokenizer added) adds none. So the
    offsets index the returned text and their total is its length."""
    if not prompt:
        return [], []
    first = _top_entry(prompt[0], "", 0.0, table, as_ids)
    first["logprob"], first["top_logprobs"] = None, None
    entries = [first, *(_entry(position, top_n, "completion", table, as_ids) for position in positions)]
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    characters, at = [], 0
    for token in prompt:
        piece = decoder.decode(table.data(token))
        if at == 0 and piece.startswith(" ") and not text.startswith(piece):
            piece = piece[1:]  # SentencePiece's leading space on the first word
        shown = text.startswith(piece, at)
        characters.append(len(piece) if shown else 0)
        at += len(piece) if shown else 0
    characters[-1] += len(text) - at
    return entries, characters


def prompt_logprobs_body(prompt: Sequence[int], positions: Sequence[TokenLogprobs], top_n: int
                         ) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: ``None`` for the first token (nothing predicts it), then per token
    ``{token id: {logprob, rank, decoded_token}}`` for the ``top_n`` best and the prompt's own token."""
    body: list[dict[str, dict[str, Any]] | None] = [None] if prompt else []
    for position in positions:
        best = sorted((c for c in position.candidates if c.rank is not None and c.rank <= top_n),
                      key=lambda c: c.rank or 0)
        shown = {position.token_id: (position.logprob, position.rank, position.token)}
        for c in best:
            shown.setdefault(c.token_id, (c.logprob, c.rank, c.token))
        body.append({str(t): {"logprob": max(lp, LOGPROB_FLOOR), "rank": rank, "decoded_token": token}
                     for t, (lp, rank, token) in shown.items()})
    return body


class TokenCharacters:
    """Characters each generated token adds to the text, counted as ``prompt_entries`` counts an echoed
    prompt's, so a ``text_offset`` means the same on both: a character split over tokens counts at the
    token that completes it, and the characters before it in the token that starts it count there. The
    engine's own spelling puts a split character and everything its first token held on the token that
    completes it (`` \xf0\x9f\x98`` + ``\x8f`` spelled ``""`` + ``" 😏"``), so within such a run the
    token table's bytes are decoded instead; elsewhere the engine's spellings (special tokens, a
    tokenizer's own spaces) add up to the text. One per choice: the decoder carries across deltas."""

    def __init__(self, table: TokenTable | None) -> None:
        self.table = table
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def count(self, delta: CompletionDelta, top_n: int | None) -> list[int]:
        if top_n is None or delta.logprobs is None:
            return []
        if self.table is None:
            return [len(position.token) for position in delta.logprobs]
        counts = []
        for position in delta.logprobs:
            data = self.table.data(position.token_id)
            inside = bool(self.decoder.getstate()[0])
            piece = self.decoder.decode(data)
            counts.append(len(piece) if inside or not _utf8(data) else len(position.token))
        return counts


def render_logprobs(kind: Kind, entries: list[dict[str, Any]], text_offset: int,
                    characters: list[int]) -> dict[str, Any]:
    """Chat's ``content`` list, or completions' parallel lists; a ``text_offset`` counts the characters
    of the text before its token (``characters``: ``TokenCharacters`` counts of the entries)."""
    if kind == "chat":
        return {"content": entries}
    offsets = list(itertools.accumulate(characters[:-1], initial=text_offset)) if characters else []
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [None if e["top_logprobs"] is None
                             else {t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
            "text_offset": offsets}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None,
          predictions: PredictionUsage | None = None) -> dict[str, Any]:
    """OpenAI's usage block; the details appear when the engine reported them."""
    body: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    if predictions is not None:
        body["completion_tokens_details"] = predictions.details()
    return body


def envelope(kind: Kind, rid: str, model: str, chunk: bool, created: int) -> dict[str, Any]:
    """A reply's or chunk's head; ``created`` is the request's, the same in every chunk of a stream.
    ``system_fingerprint`` is always present, as in OpenAI's replies, and null as in vLLM's."""
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    obj = {"chat": "chat.completion", "completion": "text_completion"}[kind]
    if chunk and kind == "chat":
        obj += ".chunk"
    return {"id": f"{prefix}-{rid}", "object": obj, "created": created, "model": model, "system_fingerprint": None}


REPLY_MESSAGE_NULLS = ("refusal", "annotations", "audio", "function_call", "reasoning")
"""A reply message's fields this model never fills, null as vLLM's replies name them (the SDK's
``message.model_dump()`` sends them back as history, which ``ChatMessage`` accepts)."""


def choice_body(kind: Kind, index: int, text: str, logprobs: dict[str, Any] | None, finish_reason: str | None,
                *, chunk: bool, first: bool = False, stop_reason: int | str | None = None) -> dict[str, Any]:
    """One choice: a chat message or delta (``first`` delta carries the role), or a completion's text.
    ``stop_reason`` is vLLM's: the stop sequence or stop token id that ended it, else null."""
    ending = {"finish_reason": finish_reason, "stop_reason": stop_reason}
    if kind == "completion":
        return {"index": index, "text": text, "logprobs": logprobs, **ending}
    if chunk:
        delta: dict[str, Any] = {"content": text}
        if first:
            delta["role"] = "assistant"
        return {"index": index, "delta": delta, "logprobs": logprobs, **ending}
    message = {"role": "assistant", "content": text, **dict.fromkeys(REPLY_MESSAGE_NULLS)}
    return {"index": index, "message": message, "logprobs": logprobs, **ending}


def continuous_usage(request: SamplingFields) -> bool:
    """``stream_options.continuous_usage_stats`` (vLLM's extension): every chunk carries the usage
    so far, and the final usage chunk follows as with ``include_usage``."""
    options = request.stream_options
    return bool(request.stream and options and options.continuous_usage_stats)


def stream_flags(request: SamplingFields) -> tuple[bool, bool]:
    options = request.stream_options
    include_usage = bool(request.stream and options and (options.include_usage or options.continuous_usage_stats))
    return request.stream, include_usage


class Sampled(NamedTuple):
    text: str
    finish_reason: str
    stop_reason: int | str | None = None
    """vLLM's: the stop sequence or stop token id that ended the text (``None`` for an end-of-sequence token)."""


def sampled_text(prompt: Sequence[int], ids: Sequence[int], stops: Sequence[str], ignore_eos: bool,
                 min_tokens: int, eos_ids: Collection[int], tokenizer: Any,
                 stop_token_ids: Collection[int] = (), keep_stop: bool = False) -> Sampled:
    """The text and finish reason the engine gave when it sampled ``ids`` after ``prompt`` — what a
    replay (the codec's decode mode) must show. It repeats vLLM's output processor token by token:
    incremental detokenization after the prompt with special tokens skipped (an incomplete UTF-8
    character at the end is not shown); an end-of-sequence token ends it, left out (``"stop"``;
    none under ``ignore_eos``), and so does one of ``stop_token_ids`` (also under ``ignore_eos``:
    vLLM's ``check_stop``); after ``min_tokens``, each token's new characters (with the
    ``len(stop) − 1`` before them) are searched for the stop sequences, the one ending earliest
    winning (ties: the request's order), and the text is cut where it starts, or where it ends with
    ``keep_stop`` (vLLM's ``include_stop_str_in_output``) (``"stop"``); else
    ``"length"``. For a sampled generation only its last token can end it; tokens that are not one
    (decode mode's arbitrary bytes) show what the engine would have stopped at."""
    step = _text_steps(tokenizer, prompt)
    text = ""
    for n, token in enumerate(ids, start=1):
        if not ignore_eos and token in eos_ids:
            return Sampled(text, "stop")
        if token in stop_token_ids:
            return Sampled(text, "stop", token)
        before = len(text)
        text += step(token)
        if stops and n > min_tokens and len(text) > before:
            found = _earliest_stop(text, before, stops)
            if found is not None:
                start, end, stop = found
                return Sampled(text[:end if keep_stop else start], "stop", stop)
    return Sampled(text, "length")


def _earliest_stop(text: str, before: int, stops: Sequence[str]) -> tuple[int, int, str] | None:
    """Where the stop sequence that a step completed first starts and ends, and which it is (``before``: the
    text's length before the step)."""
    best: tuple[int, int, str] | None = None
    for stop in stops:
        at = text.find(stop, max(0, before + 1 - len(stop)))
        if at != -1 and (best is None or at + len(stop) < best[1]):
            best = (at, at + len(stop), stop)
    return best


def _text_steps(tokenizer: Any, prompt: Sequence[int]) -> Callable[[int], str]:
    """One token's new text at a time, as vLLM's fast detokenizer produces it (``DecodeStream`` primed
    with the prompt); for a tokenizer without one, the growth of the whole output's decoded text."""
    from tokenizers import Tokenizer, decoders

    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if isinstance(backend, Tokenizer):
        stream = decoders.DecodeStream(ids=list(prompt), skip_special_tokens=True)

        def fast(token: int) -> str:
            nonlocal stream
            try:
                return stream.step(backend, token) or ""
            except (OverflowError, TypeError):
                return ""
            except Exception:  # an invalid prefix: vLLM starts a new stream without the prompt
                stream = decoders.DecodeStream(skip_special_tokens=True)
                return stream.step(backend, token) or ""

        return fast
    seen: list[int] = []
    shown = 0

    def slow(token: int) -> str:
        nonlocal shown
        seen.append(token)
        full = str(tokenizer.decode(seen, skip_special_tokens=True, clean_up_tokenization_spaces=False))
        if full.endswith("\ufffd"):
            return ""
        new, shown = full[shown:], len(full)
        return new

    return slow
