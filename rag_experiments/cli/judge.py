"""``python -m rag_experiments.judge fit|card ...``: train a claim verifier; print a judge's validity card.

    python -m rag_experiments.judge fit [--corpus DIR] [--labels FILE ...] [--out DIR]
    python -m rag_experiments.judge card --judge NAME [--pairs FILE] [--json]
"""

from __future__ import annotations

import sys

from rag_experiments.tracking.errors import cli_main

USAGE = "usage: python -m rag_experiments.judge {fit,card} [options]  (--help after the command for its options)"
HELP = """commands:
  fit    train the claim verifier on synthetic and labelled pairs (docs/judges.md)
  card   print a judge's validity card on labelled or synthetic pairs"""


@cli_main
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):  # asked for: the usage on stdout, exit 0
        print(f"{USAGE}\n\n{HELP}")
        return 0
    if not argv or argv[0] not in ("fit", "card"):
        print(USAGE, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "fit":
        from rag_experiments.cli.judge_fit import main as run  # heavy (torch): only when asked
    else:
        from rag_experiments.cli.judge_card import main as run
    return run(rest)


if __name__ == "__main__":
    raise SystemExit(main())
