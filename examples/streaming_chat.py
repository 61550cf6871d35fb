"""Streaming chat with the OpenAI SDK: print each delta as it arrives, then the usage.

    python examples/streaming_chat.py "write a function that reverses a list"
"""

from __future__ import annotations

import sys

from _common import openai_client, parser


def main() -> None:
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("prompt", nargs="?", default="def fibonacci(n):")
    cli.add_argument("--max-tokens", type=int, default=40)
    args = cli.parse_args()
    client, model = openai_client(args)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": args.prompt}], max_tokens=args.max_tokens,
        temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = 0
    usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            sys.stdout.write(chunk.choices[0].delta.content)
            sys.stdout.flush()
            chunks += 1
        usage = chunk.usage or usage
    print(f"\n--- chunks={chunks} completion_tokens={usage.completion_tokens if usage else None}")


if __name__ == "__main__":
    main()
