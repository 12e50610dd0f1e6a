"""The molecules benchmark (AWRS paper): llamppl's methods beside genlm-control AWRS-SMC.

Same LM (SmolLM2-135M-Instruct), prompts, stop rule and metric as the peer
(``benchmarks/awrs_tasks.py``); the peer runs in its own venv
(``scripts/setup-genlm.sh``, ``benchmarks/peers/genlm_awrs.py``) and its records are
passed with ``--peer``. Methods and options: ``benchmarks/awrs_runs.py``::

    .venv/bin/python benchmarks/bench_molecules.py --replicates 3 \\
        --peer benchmarks/results/genlm_awrs_molecules*.jsonl

The last line printed is machine-readable (``{"awrs_report": [...]}``).
"""

from __future__ import annotations

import sys

from awrs_runs import main

if __name__ == "__main__":
    main("molecules", sys.argv[1:])
