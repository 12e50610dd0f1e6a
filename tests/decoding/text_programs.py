"""Shared by the text-structure tests: the benchmark modules they read, and a small exact LM.

- :func:`load_benchmark` imports ``benchmarks/<name>.py`` (``collie_judge`` first points
  NLTK at the shared Punkt data, so the judge's splitters run offline);
- ``LM`` is a :class:`~llamppl.FunctionLM` over a few word pieces, small enough that
  :func:`brute` sums every token sequence: the exact posterior and Z a ``HardConstraint``
  on it must reproduce.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import sys
from pathlib import Path

from llamppl import FunctionLM

ROOT = Path(__file__).resolve().parents[2]


def load_benchmark(name: str):
    """The module ``benchmarks/<name>.py``, imported once."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


VOCAB = ["He", " ran", ".", " ra", "n", " b", "<eos>"]
EOS = len(VOCAB) - 1


def _logits(ctx):
    n, last = len(ctx), ctx[-1]
    return [math.cos(1.1 * i + 0.5 * n + 0.3 * last) for i in range(EOS)] + [-1.0 + 0.5 * n]


LM = FunctionLM(VOCAB, EOS, _logits)

_BRUTE: dict[tuple[str, int], tuple[dict[str, float], float]] = {}


def brute(constraint, max_tokens):
    """{text: P} and Z: token sequences of at most ``max_tokens`` (end token included) that
    end with EOS, or are cut at ``max_tokens``, and whose text passes the complete check."""
    if (repr(constraint), max_tokens) in _BRUTE:  # shared by the proposals' cases
        return _BRUTE[repr(constraint), max_tokens]
    weights: dict[str, float] = {}
    for k in range(1, max_tokens + 1):
        for seq in itertools.product(range(len(VOCAB)), repeat=k):
            if EOS in seq[:-1] or (seq[-1] != EOS and k < max_tokens):
                continue
            text = "".join(VOCAB[t] for t in seq if t != EOS)
            if constraint.accepts_end(text):
                key = text  # posterior keys are the text, no end token
                weights[key] = weights.get(key, 0.0) + math.exp(LM.sequence_logprob([0], seq))
    z = sum(weights.values())
    _BRUTE[repr(constraint), max_tokens] = ({key: w / z for key, w in weights.items()}, z)
    return _BRUTE[repr(constraint), max_tokens]
