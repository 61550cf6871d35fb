"""Model-free replay of predicted outputs on real edits from this project's own git history.

    python benchmarks/bench_predict_replay.py                  # 120 edits, both shapes, all proposers
    python benchmarks/bench_predict_replay.py --edits 40 --proposers cascade,ngram64
    python benchmarks/bench_predict_replay.py --rev cffb27b     # the edits as of that commit
    python benchmarks/bench_predict_replay.py --repo ../flask --rev HEAD   # another project's history

Each edit is one ``.py`` file before and after a commit of this repository, read with ``git`` at run
time (nothing is copied into the repository); ``--rev`` fixes the newest commit, so a figure can be
reproduced after the history has grown (the newest edits and the halves change with every commit).
The before-file is the prediction and sits in the prompt (as a user asking for an edit would send
it); the after-file is what the model writes:
"exact" = the after-file itself, "chat" = the answer a small instruct model gives (a ```python
fence around it, runs of blank lines collapsed to one). Tokens come from the default model's
tokenizer (``models/pycoder-23m``) through the proposer's own ``tokenizer_vocabulary``.

Greedy verification is replayed step by step (``cascade.predict.simulator``'s rule: the longest
matching prefix of the draft is accepted, then the target's next token is emitted; no draft past the
last target token). Columns: tokens per target forward step (higher is better; no proposer = 1.00)
and the share of drafted tokens accepted. Proposers:

- cascade: the service's proposer, exactly as the service runs it (``simulate`` defaults, K = 64,
  the prompt's tokens passed as the service passes them, the code datastore the service builds for
  the tokenizer from this environment's Python sources: ~25 s on the first run, then cached);
- cascade-nostore: the same without the code datastore (``prediction_datastore_mib`` 0), to show
  what it adds;
- ngram K: vLLM 0.32's n-gram prompt lookup, ported: over prompt + output, the longest n-gram
  (``prompt_lookup_min``..``max``, 2..4 as this project's HTTP benchmark sets them) ending the
  context, at its earliest occurrence, drafts the ≤ K tokens that follow it;
- suffix: Arctic Inference's suffix-tree draft (``SuffixTree.speculate``, path mode), ported
  without a tree: for every match length 1..depth-1 the occurrences of the context's suffix in
  prompt + output are the node, the next token is the most frequent continuation (ties: earliest),
  its probability the count ratio, stopping below ``min_token_prob`` (0.1), at ``match_len ×
  max_spec_factor`` (1.0) tokens and at the tree depth; the best-scoring (sum of probabilities,
  ties to the longer match) draft wins. Simplified: one tree over prompt + output (Arctic's global
  tree of earlier responses is empty for a lone request and its copy of this response is the same
  text); ties between equally frequent children may pick another child than Arctic's ordering.
  "suffix24" = vLLM's defaults (depth 24, K = 24); "suffix128" = depth 128, K = 64;
- diff: a reference, not a proposer anyone can run: a token-level difflib diff of the prediction and
  the target (it knows the answer's alignment), drafting the rest of the current matching block.

Edits are split into halves by commit order (even/odd): the proposer was tuned looking at the even
half only; the odd half is held out. Ratios are against the best peer (ngram/suffix) per shape.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "service"), str(REPO / "clients")]
HISTORY = REPO  # whose git history the edits come from (``--repo``)

Proposer = Callable[[Sequence[int], int], list[int]]
PROMPT = "Apply the change to this file and answer with the whole new file.\n```python\n{before}```\n"


@dataclass
class Edit:
    commit: str
    path: str
    before: str
    after: str
    held_out: bool


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(HISTORY), *args], check=True, capture_output=True,
                          text=True, errors="replace").stdout


def history_edits(count: int, min_bytes: int, max_bytes: int, min_similarity: float,
                  rev: str = "HEAD") -> list[Edit]:
    """Single-file ``.py`` edits, newest commit first (from ``rev`` back), at most two files per commit."""
    edits: list[Edit] = []
    for commit in git("log", "--format=%H", "--no-merges", rev).split():
        changed = git("diff-tree", "--no-commit-id", "-r", "--diff-filter=M", "--name-only", commit).split()
        taken = 0
        for path in sorted(p for p in changed if p.endswith(".py")):
            before, after = git("show", f"{commit}^:{path}"), git("show", f"{commit}:{path}")
            if not (min_bytes <= len(after) <= max_bytes and min_bytes <= len(before) <= max_bytes):
                continue
            if difflib.SequenceMatcher(None, before, after, autojunk=False).quick_ratio() < min_similarity:
                continue
            edits.append(Edit(commit[:10], path, before, after, held_out=len(edits) % 2 == 1))
            taken += 1
            if taken == 2 or len(edits) == count:
                break
        if len(edits) == count:
            break
    return edits


def chat_shaped(text: str) -> str:
    """What a small instruct model answers: fenced, runs of blank lines collapsed to one."""
    return "```python\n" + re.sub(r"\n(?:[ \t]*\n)+", "\n\n", text).rstrip("\n") + "\n```"


def suffix_ends(context: np.ndarray, upto: int) -> list[np.ndarray]:
    """ends[m] = every end e (exclusive, e < len) with context[e-m:e] == context[-m:], m = 1..upto."""
    n = len(context)
    ends = np.nonzero(context[:-1] == context[-1])[0] + 1
    out = [ends]
    for m in range(2, upto + 1):
        ends = ends[ends >= m]
        ends = ends[context[ends - m] == context[n - m]]
        out.append(ends)
        if not len(ends):
            break
    return out


def ngram_proposer(min_n: int, max_n: int) -> Proposer:
    """vLLM 0.32's rule: longest n-gram (capped at max_n) matching the context's end, earliest occurrence."""
    def propose(context: Sequence[int], k: int) -> list[int]:
        tokens = np.asarray(context)
        if len(tokens) < min_n or k <= 0:
            return []
        per_length = suffix_ends(tokens, max_n)
        for m in range(len(per_length), min_n - 1, -1):
            ends = per_length[m - 1]
            if len(ends):
                start = int(ends.min())
                return tokens[start:start + k].tolist()
        return []
    return propose


def suffix_proposer(depth: int, k_max: int, factor: float = 1.0, min_prob: float = 0.1) -> Proposer:
    """Arctic's path speculation over a suffix tree of prompt + output, without the tree (see module doc)."""
    def draft_from(tokens: np.ndarray, ends: np.ndarray, limit: int) -> tuple[list[int], float]:
        n = len(tokens)
        node = np.append(ends, n)  # the context's own occurrence ends the sequence: counted, no child
        drafted: list[int] = []
        prob, score = 1.0, 0.0
        while len(drafted) < limit:
            live = node[node < n]
            if not len(live):
                break
            if len(live) == 1 and len(node) == 1:  # one path left: the rest of it, probability unchanged
                rest = tokens[live[0]:live[0] + limit - len(drafted)].tolist()
                drafted += rest
                score += prob * len(rest)
                break
            values, first, counts = np.unique(tokens[live], return_index=True, return_counts=True)
            best = max(range(len(values)), key=lambda i: (counts[i], -first[i]))
            prob *= counts[best] / len(node)
            if prob < min_prob:
                break
            drafted.append(int(values[best]))
            score += prob
            node = live[tokens[live] == values[best]] + 1
        return drafted, score

    def propose(context: Sequence[int], k: int) -> list[int]:
        tokens = np.asarray(context)
        k = min(k, k_max)
        if len(tokens) < 2 or k <= 0:
            return []
        best: list[int] = []
        best_score = 0.0
        for m, ends in enumerate(suffix_ends(tokens, depth - 1), start=1):
            if not len(ends):
                break
            limit = max(0, min(k, int(m * factor + 1e-6), depth - m))
            drafted, score = draft_from(tokens, ends, limit)
            if score >= best_score:
                best, best_score = drafted, score
        return best
    return propose


def diff_proposer(prediction: Sequence[int], target: Sequence[int]) -> Proposer:
    """Reference: the rest of the matching block of a token diff that knows the target."""
    draft_at: dict[int, list[int]] = {}
    blocks = difflib.SequenceMatcher(None, list(prediction), list(target), autojunk=False).get_matching_blocks()
    for a, b, size in blocks:
        for offset in range(size):
            draft_at[b + offset] = list(prediction[a + offset:a + size])
    state = {"prompt": -1}

    def propose(context: Sequence[int], k: int) -> list[int]:
        position = len(context) - state["prompt"]
        return draft_at.get(position, [])[:k]

    def bind(prompt_length: int) -> None:
        state["prompt"] = prompt_length
    propose.bind = bind  # type: ignore[attr-defined]
    return propose


@dataclass
class Tally:
    tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    per_edit: list[float] = field(default_factory=list)

    def add(self, tokens: int, steps: int, drafted: int, accepted: int) -> None:
        self.tokens += tokens
        self.steps += steps
        self.drafted += drafted
        self.accepted += accepted
        self.per_edit.append(tokens / max(1, steps))

    @property
    def per_step(self) -> float:
        return self.tokens / max(1, self.steps)

    @property
    def share(self) -> float:
        return self.accepted / max(1, self.drafted)


def replay(target: Sequence[int], prompt: Sequence[int], propose: Proposer, k: int) -> tuple[int, int, int]:
    """The simulator's greedy rule for a proposer over prompt + output: (steps, drafted, accepted)."""
    output: list[int] = []
    draft: list[int] = []
    steps = drafted = accepted_total = 0
    while len(output) < len(target):
        position = len(output)
        accepted = 0
        while (accepted < len(draft) and position + accepted < len(target)
               and draft[accepted] == target[position + accepted]):
            accepted += 1
        output += target[position:position + accepted + 1]
        steps += 1
        drafted += len(draft)
        accepted_total += accepted
        room = min(k, len(target) - len(output) - 1)
        draft = propose([*prompt, *output], room)[:room] if room > 0 else []
    return steps, drafted, accepted_total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edits", type=int, default=120)
    parser.add_argument("--rev", default="HEAD", help="newest commit to take edits from")
    parser.add_argument("--repo", type=Path, default=REPO,
                        help="git repository (a bare one too) whose history gives the edits: this one by default; "
                        "another project's is a check on edits the proposer was never tuned on")
    parser.add_argument("--k", type=int, default=64, help="Cascade's K (num_speculative_tokens)")
    parser.add_argument("--proposers", default="cascade,cascade-nostore,ngram8,ngram64,suffix24,suffix128,diff")
    parser.add_argument("--min-bytes", type=int, default=400)
    parser.add_argument("--max-bytes", type=int, default=16000)
    parser.add_argument("--min-similarity", type=float, default=0.5)
    parser.add_argument("--ngram-min", type=int, default=2)
    parser.add_argument("--ngram-max", type=int, default=4)
    parser.add_argument("--model", default=str(REPO / "models" / "pycoder-23m"))
    args = parser.parse_args()
    global HISTORY
    HISTORY = args.repo

    from cascade.predict.simulator import simulate
    from cascade.vllm_compat.proposer import tokenizer_vocabulary
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    vocab = tokenizer_vocabulary(tokenizer)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    started = time.perf_counter()
    edits = history_edits(args.edits, args.min_bytes, args.max_bytes, args.min_similarity, args.rev)
    names = args.proposers.split(",")
    peers = [n for n in names if n.startswith(("ngram", "suffix"))]
    tallies: dict[tuple[str, str, bool | None], Tally] = {}
    timings: dict[str, float] = {}
    for edit in edits:
        prediction = encode(edit.before)
        prompt = encode(PROMPT.format(before=edit.before))
        for shape, text in (("exact", edit.after), ("chat", chat_shaped(edit.after))):
            target = encode(text)
            for name in names:
                began = time.perf_counter()
                if name in ("cascade", "cascade-nostore"):
                    store = None if name == "cascade-nostore" else "service"
                    result = simulate(target, prediction, vocab, args.k, prompt=prompt, datastore=store)
                    outcome = (result.steps, result.proposed, result.accepted)
                elif name == "diff":
                    proposer = diff_proposer(prediction, target)
                    proposer.bind(len(prompt))  # type: ignore[attr-defined]
                    outcome = replay(target, prompt, proposer, args.k)
                elif name.startswith("ngram"):
                    outcome = replay(target, prompt, ngram_proposer(args.ngram_min, args.ngram_max), int(name[5:]))
                elif name == "suffix24":
                    outcome = replay(target, prompt, suffix_proposer(24, 24), 24)
                elif name == "suffix128":
                    outcome = replay(target, prompt, suffix_proposer(128, 64), 64)
                else:
                    raise SystemExit(f"unknown proposer {name}")
                timings[name] = timings.get(name, 0.0) + time.perf_counter() - began
                steps, drafted, accepted = outcome
                for half in (edit.held_out, None):
                    key = (name, shape, half)
                    tallies.setdefault(key, Tally()).add(len(target), steps, drafted, accepted)

    held = sum(e.held_out for e in edits)
    where = "this repository" if HISTORY == REPO else str(HISTORY)
    print(f"{len(edits)} edits from {len({e.commit for e in edits})} commits of {where} up to "
          f"{git('rev-parse', '--short', args.rev).strip()} "
          f"({len(edits) - held} tuned on, {held} held out); K = {args.k} for cascade; "
          f"{time.perf_counter() - started:.0f} s")
    print("tokens per target forward step (× = against the best ngram/suffix peer of that column), "
          "drafted tokens accepted")
    columns = [(shape, half) for shape in ("exact", "chat") for half in (None, False, True)]
    label = {None: "all", False: "tuned", True: "held-out"}
    print(f"{'proposer':<16}" + "".join(f"{shape + ' ' + label[half]:>26}" for shape, half in columns))
    best = {col: max((tallies[(p, *col)].per_step for p in peers), default=0.0) for col in columns}
    for name in names:
        cells = []
        for col in columns:
            tally = tallies[(name, *col)]
            ratio = tally.per_step / best[col] if best[col] else 0.0
            cells.append(f"{tally.per_step:6.2f} {ratio:5.3f}× {100 * tally.share:5.1f} %")
        print(f"{name:<16}" + "".join(f"{c:>26}" for c in cells))
    if "cascade" in names and peers:
        for shape in ("exact", "chat"):
            ours = tallies[("cascade", shape, None)].per_edit
            best_peer = [max(tallies[(p, shape, None)].per_edit[i] for p in peers) for i in range(len(ours))]
            wins = sum(o >= b for o, b in zip(ours, best_peer, strict=True))
            print(f"{shape}: cascade ≥ the best peer on {wins}/{len(ours)} edits")
    print("replay seconds: " + ", ".join(f"{n} {t:.1f}" for n, t in timings.items()))


if __name__ == "__main__":
    main()
