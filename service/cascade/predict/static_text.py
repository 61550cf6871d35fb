"""The prediction proposer's core: ranked draft sources for one request, and how far to trust them.

Pure Python (no vLLM). The engine adapter feeds it the tokens each step accepted and asks it for the
next drafts. Sources, best first:

1. **The prediction**, followed as text: a byte cursor advances while the output spells the
   prediction's text (whatever the token boundaries). When the output leaves it, the cursor is
   re-anchored at once and after every later token, inside lines: the longest suffix of the output's
   recent bytes that occurs in the prediction, nearest to where the output was expected to be
   (``PredictionText.anchor``). It drafts only with enough evidence (``min_evidence`` bytes); no
   line is ever skipped blindly. A second spelling of the prediction without trailing whitespace and
   with blank-line runs collapsed lets an answer that writes one blank line where the file has two
   keep its place (the spelling with the longer match wins, ties keep the current one). Before
   anything anchored, an output line that opens a code fence anchors at the prediction's first line
   (after a leading sentence without a fence, the usual re-anchoring finds it a few bytes in; a
   sampled request waits for that evidence after a fence too).
2. **The prompt and the output so far** (``TokenNgramSource``): the continuation of the longest
   recent n-gram, so new code shaped like existing code is drafted too; then the most frequent
   successor of the last few tokens (``SuccessorCounts``). A greedy request copies from its first
   step, as vLLM's n-gram proposer does (its output is the same whatever is drafted), on
   ``min_evidence`` bytes until the output has followed the prediction. A sampled
   request (``sampled=True``) copies only once the output has followed the prediction: a prediction
   its output never follows drafts nothing at all, so a seed gives the sample it gives without one.
   Earlier responses of the same ``user`` (``responses``, the engine's ``ResponseCache``) are copied
   the same way: what suffix decoding's global tree gives vLLM, for retries and repeated edits.
3. **Code written elsewhere** (``CodeDatastore``, this environment's Python sources): where nothing
   of the request drafts, the most frequent continuation of the last few tokens in that corpus, while
   its estimated probability stays at or above ``datastore_probability`` (raised in a step shared by
   other requests, as ``DraftLength.scale`` raises draft lengths' evidence). Gated like the copies;
   counted with the request's own successor guesses (``successors``).

The source with more evidence drafts (ties: the prediction), and ``DraftLength`` turns its evidence
(the matched bytes plus every byte it held since) into a draft length. Sources that agree lend each
other confidence: a copy whose draft only re-spells the prediction's longer one hands the step to the
prediction, and the prediction's draft grows by a share of the bytes of every n-gram of the prompt or
the output that continues the same way (``agreement_bonus``). ``mode="prefix"`` is OpenAI's
behaviour: follow the prediction from its start and stop at the first miss, no other source.

Counts: ``proposed``/``accepted`` cover every draft (what the engine verifies and reports);
``drafted_by_source``/``accepted_by_source`` split them by source, and ``prediction_accepted``/
``prediction_rejected`` are the usage counts of OpenAI's fields (drafts from the prediction only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from cascade.predict.code_datastore import CodeDatastore
from cascade.predict.draft_length import ConfidenceLength, DraftLength
from cascade.predict.prediction_text import PredictionText, collapse_blank_lines
from cascade.predict.successor_counts import SuccessorCounts
from cascade.predict.token_source import NgramMatch, TokenNgramSource
from cascade.predict.vocabulary import Vocabulary, text_of

Mode = Literal["smart", "prefix"]
Source = Literal["prediction", "prompt", "output", "responses", "successors"]
SOURCES: tuple[Source, ...] = ("prediction", "prompt", "output", "responses", "successors")
TAIL_BYTES = 256
NEWLINE = b"\n"
AGREEING_TOKENS = 2  # a copy agrees with the prediction when its next tokens are the prediction's draft's first


def normalise_newlines(text: str) -> str:
    """CRLF and lone CR become LF, so a Windows-edited prediction still matches model output."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


class PredictionState:
    """Per-request proposer state. ``observe`` once per engine step, then ``propose``."""

    def __init__(self, prediction_ids: Sequence[int], vocab: Vocabulary, mode: Mode = "smart",
                 lengths: DraftLength | None = None, prompt_ids: Sequence[int] = (), k: int = 64,
                 min_evidence: int = 8, ngram_min: int = 2, ngram_max: int = 16, carry: float = 0.0,
                 near_bytes: int = 256, min_near_evidence: int = 4, far_margin: int = 8,
                 min_prompt_evidence: int = 0, min_output_evidence: int = 0, successor_n: int = 3,
                 min_successor_probability: float = 0.3, successor_below: int = 1, successor_tokens: int = 4,
                 copy_trust: float = 0.5, agreement_bonus: float = 0.75, sampled: bool = False,
                 responses: TokenNgramSource | None = None, min_response_evidence: int = 0,
                 datastore: CodeDatastore | None = None, datastore_probability: float = 0.5,
                 datastore_tokens: int = 4) -> None:
        self.vocab = vocab
        self.mode = mode
        self.sampled = sampled
        self.lengths = lengths or ConfidenceLength(k)
        self.min_evidence = min_evidence
        ids = [t for t in prediction_ids if vocab.piece(t)]
        exact = PredictionText(text_of(vocab, ids), vocab, ids)
        self.spellings = [exact]
        collapsed = collapse_blank_lines(exact.text)
        if mode == "smart" and collapsed != exact.text:
            self.spellings.append(PredictionText(collapsed, vocab))
        self.spelling = 0
        self.cursor = 0
        self.evidence = len(exact.text)  # the prediction's start needs no evidence: it is where answers start
        self.expected = 0  # where in the exact spelling the output is thought to be while lost
        self.anchored = False  # whether the output has followed the prediction's text yet
        self.held_before = 0
        self.copy_held = 0  # bytes the prompt/output copy drafted whole in a row
        self.carry = carry
        self.near_bytes = near_bytes
        self.min_near_evidence = min_near_evidence
        self.far_margin = far_margin
        self.min_copy_evidence = {"prompt": min_prompt_evidence, "output": min_output_evidence,
                                  "responses": min_response_evidence}
        self.copies: dict[Source, TokenNgramSource] = {
            "prompt": TokenNgramSource(ngram_min, ngram_max), "output": TokenNgramSource(ngram_min, ngram_max)}
        if mode == "smart" and responses is not None:
            self.copies["responses"] = responses  # shared, read only here
        self._context: list[int] = list(prompt_ids[-ngram_max:])
        self.successors = SuccessorCounts(successor_n)
        self.min_successor_probability = min_successor_probability
        self.successor_below = successor_below
        self.successor_tokens = successor_tokens
        self.agreement_bonus = agreement_bonus
        self.copy_trust = copy_trust  # a copy's evidence counts this much towards its draft length
        self.datastore = datastore if mode == "smart" else None
        self.datastore_probability = datastore_probability
        self.datastore_tokens = datastore_tokens
        if mode == "smart" and prompt_ids:
            self.copies["prompt"].add(0, prompt_ids)
            self.successors.add(prompt_ids)
        self._first_output = True
        self.tail = b""
        self.last_proposal: list[int] = []
        self.last_source: Source | None = None
        self.drafted_by_source = dict.fromkeys(SOURCES, 0)
        self.accepted_by_source = dict.fromkeys(SOURCES, 0)
        self.reanchors = 0

    @property
    def text(self) -> bytes:
        return self.spellings[self.spelling].text

    @property
    def output_tokens(self) -> list[int]:
        """The tokens written so far (what a finished request leaves to the response cache)."""
        return self.copies["output"].tokens(0)

    @property
    def proposed(self) -> int:
        return sum(self.drafted_by_source.values())

    @property
    def accepted(self) -> int:
        return sum(self.accepted_by_source.values())

    @property
    def rejected(self) -> int:
        return self.proposed - self.accepted

    @property
    def prediction_accepted(self) -> int:
        return self.accepted_by_source["prediction"]

    @property
    def prediction_rejected(self) -> int:
        return self.drafted_by_source["prediction"] - self.accepted_by_source["prediction"]

    @property
    def retokenised(self) -> int:
        return sum(s.retokenised for s in self.spellings)

    def _count_accepted(self, new_tokens: Sequence[int]) -> int:
        """The engine keeps the longest matching prefix of the last draft, then adds a token of its own
        that differs from the next draft token (a rejected draft is never resampled as itself)."""
        accepted = 0
        for proposed, got in zip(self.last_proposal, new_tokens, strict=False):
            if proposed != got:
                break
            accepted += 1
        if self.last_source is not None:
            self.accepted_by_source[self.last_source] += accepted
        return accepted

    def observe(self, new_tokens: Sequence[int]) -> None:
        """The tokens the engine accepted this step (accepted drafts plus its own next token)."""
        accepted = self._count_accepted(new_tokens)
        proposed = len(self.last_proposal)
        data = text_of(self.vocab, new_tokens)
        copied = self.last_source in ("prompt", "output", "responses") and accepted == proposed > 0
        self.copy_held = self.copy_held + len(data) if copied else 0
        self.last_proposal, self.last_source = [], None
        self.tail = (self.tail + data)[-TAIL_BYTES:]
        if self.mode == "smart":
            self.copies["output"].add(0, new_tokens)
            self.successors.add(new_tokens, new_stream=self._first_output)
            self._first_output = False
            self._context = (self._context + list(new_tokens))[-self.copies["output"].max_n:]
        if self.cursor >= 0 and self.text.startswith(data, self.cursor):
            self.cursor += len(data)
            self.evidence += len(data)
            self.anchored = True
            if accepted < proposed:  # the model split the text differently: re-tokenise from here
                self.spellings[self.spelling].forget_tokens(self.cursor)
            return
        if self.cursor >= 0:
            self.expected = self._exact_offset(self.cursor)
            self.held_before = self.evidence
        self.expected += len(data)
        self.cursor = -1
        self.evidence = 0
        if self.mode == "smart":
            self._reanchor()

    def _exact_offset(self, cursor: int) -> int:
        """The cursor as an offset into the exact spelling (proportional for the collapsed one)."""
        if self.spelling == 0:
            return cursor
        return cursor * len(self.spellings[0]) // max(1, len(self.spellings[self.spelling]))

    def _reanchor(self) -> None:
        """Anchor the cursor where the output's recent bytes occur: near where the output is expected
        (the region it is editing) on little evidence, anywhere else on more, and a far anchor only
        when its match is clearly longer. The current spelling wins ties."""
        best: tuple[int, bool, int, int, bool] | None = None  # (length, current, spelling, end, near)
        exact_length = len(self.spellings[0])
        for index, spelling in enumerate(self.spellings):
            expected = self.expected if index == 0 else self.expected * len(spelling) // max(1, exact_length)
            # before the output has followed the prediction there is no region being edited yet
            near = (spelling.anchor(self.tail, expected, self.min_near_evidence, self.near_bytes)
                    if self.anchored else None)
            far = spelling.anchor(self.tail, expected, self.min_evidence)
            for found, is_near in ((near, True), (far, False)):
                if found is None:
                    continue
                score = found.length if is_near else found.length - self.far_margin
                if is_near or found.length >= self.min_evidence + self.far_margin:
                    key = (score, index == self.spelling, index, found.end, is_near)
                    if best is None or key[:2] > best[:2]:
                        best = key
        strong = self.min_evidence + self.far_margin
        if not self.anchored and not self.sampled and self._after_fence() and (best is None or best[0] < strong):
            # nothing of the prediction written yet, and the output just opened a code fence: the
            # answer's code starts with the prediction's start (only there: a useless prediction must
            # not draft at every line start), most likely spelled as chat models write code, with one
            # blank line where the file has two (the collapsed spelling; an answer that keeps the
            # file's blank lines leaves it at its first run and re-anchors in the exact one). Not for a
            # sampled request: that guess would move its seeded sample even when the answer never
            # follows the prediction (an answer of fences would draft the prediction's start at each)
            self.spelling, self.cursor, self.evidence = len(self.spellings) - 1, 0, self.min_evidence
        elif best is not None:
            score, _, self.spelling, self.cursor, is_near = best
            length = score if is_near else score + self.far_margin
            # an anchor that continues the region the output was editing keeps part of its evidence
            self.evidence = length + (int(self.held_before * self.carry) if is_near else 0)
            self.reanchors += 1

    def _after_fence(self) -> bool:
        """Whether the output's last completed line opens a code fence (```, ```python …)."""
        if not self.tail.endswith(NEWLINE):
            return False
        return self.tail[:-1].rsplit(NEWLINE, 1)[-1].lstrip().startswith(b"```")

    def propose(self, limit: int, rows: int = 1) -> list[int]:
        """Up to ``limit`` draft tokens from the source with the most evidence; nothing without one.
        ``rows``: requests verified in the same engine step (see ``DraftLength``)."""
        if limit <= 0:
            return []
        source: Source | None = None
        evidence = 0
        if 0 <= self.cursor < len(self.text):
            source, evidence = "prediction", self.evidence
        copy_from: tuple[Source, NgramMatch] | None = None
        continuations: list[tuple[list[int], int]] = []  # each copy's next tokens, with its n-gram's bytes
        # a sampled request's prompt and output draft only once its output has followed the
        # prediction (a useless prediction leaves its seeded samples as they are)
        copying = self.mode == "smart" and (self.anchored or not self.sampled)
        for copy, index in self.copies.items() if copying else ():
            found = index.match(self._context)
            if found is None:
                continue
            ngram_bytes = len(text_of(self.vocab, self._context[-found.length:]))
            continuations.append((index.continuation(found, AGREEING_TOKENS), ngram_bytes))
            matched = ngram_bytes + self.copy_held
            needed = self.min_copy_evidence[copy]
            if not self.anchored:  # before the output follows the prediction: what a far anchor needs
                needed = max(needed, self.min_evidence)
            if matched > evidence and matched >= needed:
                source, evidence, copy_from = copy, matched, (copy, found)
        if copying and evidence < self.successor_below:
            guess = self._guess_new_text(limit, rows)
            if guess:
                self.last_proposal, self.last_source = guess, "successors"
                self.drafted_by_source["successors"] += len(guess)
                return guess
        if source is None:
            return []
        trusted = evidence if source == "prediction" else int(evidence * self.copy_trust)
        n = min(limit, self.lengths.length(trusted, rows))
        if source == "prediction":
            draft = self.spellings[self.spelling].tokens_at(self.cursor, n)
        else:
            assert copy_from is not None
            copy, found = copy_from
            draft = self.copies[copy].continuation(found, n, looping=copy == "output")
            if 0 <= self.cursor < len(self.text):
                # a copy that only re-spells the prediction's own text drafts prediction tokens: the
                # prediction drafts them, as far as the longer of the two drafts
                own = self.spellings[self.spelling].tokens_at(
                    self.cursor, max(len(draft), min(limit, self.lengths.length(self.evidence, rows))))
                if len(own) >= len(draft) and own[:len(draft)] == draft:
                    source, draft = "prediction", own
        if source == "prediction" and len(draft) >= AGREEING_TOKENS:
            draft = self._lengthen_on_agreement(draft, continuations, limit, rows)
        self.last_proposal, self.last_source = draft, source
        self.drafted_by_source[source] += len(draft)
        return draft

    def _guess_new_text(self, limit: int, rows: int) -> list[int]:
        """New text, drafted as the last few tokens continued most often in the request itself or in code
        elsewhere (the datastore), whichever is surer of its first token. Code elsewhere adds ~4 % tokens
        per step on replayed edits at the same accepted share; a step shared by more requests needs a
        likelier draft from it."""
        own = self.successors.propose(self._context, min(limit, self.successor_tokens), self.min_successor_probability)
        if self.datastore is None:
            return own
        elsewhere = self.datastore.successor(self._context)
        mine = self.successors.successor(self._context)
        if elsewhere is None or (own and mine and (elsewhere[0] == mine[0] or elsewhere[1] <= mine[1])):
            return own
        scale = self.lengths.scale(rows) if rows > 1 else 1.0
        needed = 1 - (1 - self.datastore_probability) / scale
        return self.datastore.propose(self._context, min(limit, self.datastore_tokens), needed) or own

    def _lengthen_on_agreement(self, draft: list[int], continuations: list[tuple[list[int], int]],
                               limit: int, rows: int) -> list[int]:
        """The prediction's draft, longer where n-grams of the prompt or the output continue the same
        way: each agreeing n-gram's bytes add ``agreement_bonus`` of themselves to the evidence. Two
        sources agreeing on the next tokens make a right first token much likelier (replayed edits:
        0.78 against 0.33 where the prompt's n-gram disagrees, on 8–16 bytes of evidence), and the
        first tokens are where a fresh anchor's drafts are lost."""
        bonus = sum(ngram_bytes for tokens, ngram_bytes in continuations if tokens == draft[:AGREEING_TOKENS])
        longer = min(limit, self.lengths.length(self.evidence + int(self.agreement_bonus * bonus), rows))
        if not bonus or longer <= len(draft):
            return draft
        return self.spellings[self.spelling].tokens_at(self.cursor, longer)

    def snapshot(self) -> dict[str, Any]:
        """State for the debug log."""
        return {"source": self.last_source, "cursor": self.cursor, "spelling": self.spelling,
                "evidence": self.evidence, "expected": self.expected,
                "tail": self.tail[-40:].decode("utf-8", "replace"), "reanchors": self.reanchors,
                "drafted_by_source": dict(self.drafted_by_source),
                "accepted_by_source": dict(self.accepted_by_source),
                "prediction_accepted": self.prediction_accepted, "prediction_rejected": self.prediction_rejected,
                "retokenised": self.retokenised}
