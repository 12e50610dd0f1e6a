"""The table of molecule and pattern benchmark records, from the command line.

Reads the JSON-lines records both sides write (:class:`awrs_records.RunRecord`) and prints
:func:`awrs_records.report`: one row per (task, method, N), the last line machine-readable
(``{"awrs_report": [...]}``)::

    .venv/bin/python benchmarks/awrs_report.py benchmarks/results/llamppl_molecules.jsonl \\
        benchmarks/results/genlm_awrs_molecules.jsonl
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from awrs_records import read_records, report

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """``python benchmarks/awrs_report.py FILE.jsonl ... [--seed S]``: print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="JSON-lines record files")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = parser.parse_args(argv)
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    print(report(read_records(*args.files), seed=args.seed))


if __name__ == "__main__":
    main(sys.argv[1:])
