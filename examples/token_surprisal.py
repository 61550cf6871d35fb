"""Per-token surprisal of a file with the OpenAI SDK and the top-k export: which tokens surprise the model?

    python examples/token_surprisal.py some_file.py [--top-k 20] [--show 8]

Sends the text as a prompt with ``"compression": true`` (an ``extra_body`` field; nothing is
sampled) and reads back, for every position, the model's top-k candidates and the actual token's
log-probability, renormalised over the kept candidates. Prints the most surprising tokens with the
model's best guess there, and the file's cost in bits (tokens outside the top-k count as the
escape a coder would pay: ``log2(vocabulary)`` bits, an upper bound). One request holds up to the
model's length (1,023 tokens by default); ``cascade export-topk`` windows longer files.
"""

from __future__ import annotations

import math
from pathlib import Path

from _common import openai_client, parser


def main() -> None:
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("file", type=Path)
    cli.add_argument("--top-k", type=int, default=20)
    cli.add_argument("--show", type=int, default=8, help="how many surprising tokens to list")
    args = cli.parse_args()
    client, model = openai_client(args)
    completion = client.completions.create(model=model, prompt=args.file.read_text(), max_tokens=0,
                                           extra_body={"compression": True, "compression_top_k": args.top_k})
    positions = completion.choices[0].logprobs.model_extra["content"]
    escape_bits = math.log2(8192)
    bits = [-p["logprob"] / math.log(2) if p["logprob"] is not None else escape_bits for p in positions]
    worst = sorted(range(len(positions)), key=lambda i: -bits[i])[: args.show]
    for i in sorted(worst):
        p = positions[i]
        guess = p["top_logprobs"][0]["token"]
        print(f"{i + 1:6d}  {bits[i]:5.1f} bits  actual {p['token']!r:16}  model expected {guess!r}")
    in_top = sum(p["logprob"] is not None for p in positions)
    print(f"--- positions={len(positions)} in_top_k={in_top} bits={sum(bits):.0f} "
          f"bits_per_token={sum(bits) / max(1, len(positions)):.3f}")


if __name__ == "__main__":
    main()
