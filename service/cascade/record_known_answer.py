"""``python -m cascade.record_known_answer MODEL_DIR [OUT]``: write the exact codec's drift known answer
for a model folder (run on the reference machine; the file ships in ``codec/exact/known_answers/``).
It lives outside the codec core because it needs the service's model fingerprint."""

from __future__ import annotations

import argparse

from cascade.codec.exact.known_answer import write_reference
from cascade.engine.fingerprint import model_fingerprint


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write the exact codec's drift known answer for a model folder.")
    parser.add_argument("model_dir")
    parser.add_argument("out", nargs="?", help="output file (default: the package's known_answers/ entry)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    print(write_reference(args.model_dir, model_fingerprint(args.model_dir), args.out, args.device))


if __name__ == "__main__":
    main()
