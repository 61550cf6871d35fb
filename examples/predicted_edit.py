"""Edit code with OpenAI's ``prediction=``: the current file is the draft, the model rewrites it.

Most of an edited file is unchanged, so the draft is mostly right; Cascade's proposer re-anchors a
few tokens after the model departs from it (where the output's last bytes occur in the draft), so
the draft keeps paying off after the edit. The output is what the model writes anyway (try
``--no-prediction``: same text, slower).

    python examples/predicted_edit.py --server http://127.0.0.1:8000
"""

from __future__ import annotations

import time

from _common import openai_client, parser
from openai import omit

CODE = '''def mean(values):
    total = 0
    for value in values:
        total += value
    return total / len(values)


def spread(values):
    return max(values) - min(values)
'''


def main() -> None:
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--no-prediction", action="store_true", help="the same request without the draft")
    args = cli.parse_args()
    client, model = openai_client(args)
    started = time.perf_counter()
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": "You edit Python code. Reply with the whole file."},
                  {"role": "user", "content": f"Rename `values` to `xs`:\n\n{CODE}"}],
        prediction=omit if args.no_prediction else {"type": "content", "content": CODE},
        max_tokens=120, temperature=0)
    seconds = time.perf_counter() - started
    print(reply.choices[0].message.content)
    usage = reply.usage
    details = usage.completion_tokens_details if usage else None
    print(f"--- finish_reason={reply.choices[0].finish_reason} "
          f"completion_tokens={usage.completion_tokens if usage else None} "
          f"accepted_prediction_tokens={details.accepted_prediction_tokens if details else None} "
          f"rejected_prediction_tokens={details.rejected_prediction_tokens if details else None} "
          f"seconds={seconds:.2f}")


if __name__ == "__main__":
    main()
