"""Shared by the text-structure tests: the shared COLLIE data, NLTK's data, and a small exact LM.

- :func:`use_shared_nltk_data` points NLTK at the Punkt data shared beside the repository
  (unless ``NLTK_DATA`` is set), so COLLIE's own classes (PyPI ``collie-bench``), which the
  tests compare with, split text offline; :func:`collie_instances` reads the shared
  COLLIE-v1 half (``COLLIE_DATA``) and :func:`rebuild` makes COLLIE's object of a tree. Each instance's ``reference_passes`` is the judge's
  verdict on its ``example`` (``tests/benchmarks/test_bench_collie.py`` checks the judge
  gives it on all of them), so the library is tested against it without loading the
  benchmark's judge;
- ``LM`` is a :class:`~llamppl.FunctionLM` over a few word pieces, small enough that
  :func:`brute` sums every token sequence: the exact posterior and Z a ``HardConstraint``
  on it must reproduce.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import sys
from pathlib import Path

from llamppl import FunctionLM

ROOT = Path(__file__).resolve().parents[2]


def _shared(*parts: str) -> Path:
    """``shared/<parts>`` in the nearest parent folder of the repository that has it."""
    for up in ROOT.parents:
        if (up / "shared" / Path(*parts)).exists():
            return up / "shared" / Path(*parts)
    return ROOT.parent / "shared" / Path(*parts)


COLLIE_DATA = _shared("data", "collie", "collie_v1.json")
NLTK_DATA = _shared("data", "collie", "nltk_data")


def use_shared_nltk_data() -> None:
    """Point NLTK at the shared Punkt data, unless the user set ``NLTK_DATA``."""
    folder = os.environ.setdefault("NLTK_DATA", str(NLTK_DATA))
    nltk = sys.modules.get("nltk")
    if nltk is not None and folder not in nltk.data.path:
        nltk.data.path.insert(0, folder)


@functools.lru_cache(maxsize=1)
def collie_instances() -> tuple[dict, ...]:
    """The shared COLLIE-v1 instances, in file order."""
    return tuple(json.loads(COLLIE_DATA.read_text(encoding="utf-8"))["instances"])


def rebuild(tree):
    """COLLIE's own constraint object (PyPI ``collie-bench``) of a JSON tree, as the data's
    README says: ``All(*callables)``, ``Relation(operand)``, ``Reduction(reduction, value)``,
    ``InputLevel(level)`` / ``TargetLevel(level)``, ``...`` for ``Ellipsis``, else
    ``cls(**attributes)``, children first."""
    import collie.constraints as cc

    if isinstance(tree, list):
        return [rebuild(node) for node in tree]
    if not isinstance(tree, dict):
        return tree
    name = tree["class"]
    if name == "Ellipsis":
        return ...
    attrs = {key: rebuild(value) for key, value in tree.items() if key != "class"}
    cls = getattr(cc, name)
    if name == "All":
        return cls(*attrs["callables"])
    if name in ("Relation", "InputLevel", "TargetLevel"):
        return cls(*attrs.values())
    if name == "Reduction":
        return cls(attrs["reduction"], attrs["value"])
    return cls(**attrs)


use_shared_nltk_data()

VOCAB = ["He", " ran", ".", " ra", "n", " b", "<eos>"]
EOS = len(VOCAB) - 1


def _logits(ctx):
    n, last = len(ctx), ctx[-1]
    return [math.cos(1.1 * i + 0.5 * n + 0.3 * last) for i in range(EOS)] + [-1.0 + 0.5 * n]


LM = FunctionLM(VOCAB, EOS, _logits)

_BRUTE: dict[tuple[str, int, int], tuple[dict[str, float], float]] = {}


def brute(constraint, max_tokens, lm=LM):
    """{text: P} and Z: token sequences of ``lm`` of at most ``max_tokens`` (end token
    included) that end with EOS, or are cut at ``max_tokens``, and whose text passes the
    complete check."""
    key = (repr(constraint), max_tokens, id(lm))
    if key in _BRUTE:  # shared by the proposals' cases
        return _BRUTE[key]
    eos = lm.eos_token_id
    weights: dict[str, float] = {}
    for k in range(1, max_tokens + 1):
        for seq in itertools.product(range(lm.vocab_size), repeat=k):
            if eos in seq[:-1] or (seq[-1] != eos and k < max_tokens):
                continue
            text = "".join(lm.vocab[t] for t in seq if t != eos)
            if constraint.accepts_end(text):
                # posterior keys are the text, no end token
                weights[text] = weights.get(text, 0.0) + math.exp(lm.sequence_logprob([0], seq))
    z = sum(weights.values())
    _BRUTE[key] = ({text: w / z for text, w in weights.items()}, z)
    return _BRUTE[key]
