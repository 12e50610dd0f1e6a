"""``generate_json``: JSON that matches a schema, sampled from the LM's exact conditional by SMC.

Runs :func:`~llamppl.inference.smc_standard` on a
:class:`~llamppl.models.GrammarConstraint` with ``json_schema=schema`` and
returns the posterior over *parsed* objects (dicts, or pydantic instances when
``schema`` is a pydantic model class) with ``log_ml`` = log Ẑ, an unbiased
estimate (in Ẑ) of P(the LM's output is valid JSON for the schema)::

    from llamppl import CachedCausalLM
    from llamppl.models import generate_json
    lm = CachedCausalLM.default()
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    out = generate_json(lm, "Ann is 31. JSON: ", schema, n_particles=8, seed=0, max_tokens=16)
    out.objects[0]          # (most probable object, its posterior probability)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llamppl.lm.base import LanguageModel
from llamppl.rng import make_rng
from llamppl.runner import run
from llamppl.validation import check_positive_int

from .grammar import GrammarConstraint

__all__ = ["generate_json", "StructuredResult"]


@dataclass
class StructuredResult:
    """Posterior over parsed objects.

    Attributes
    ----------
    objects : list[tuple[Any, float]]
        Distinct parsed objects (texts that differ only in whitespace or key order
        are one object) with their posterior probabilities, largest first.
    texts : list[tuple[str, float]]
        The same, as the generated JSON texts.
    log_ml : float
        log Ẑ, the log estimate of P(valid output); ``-inf`` if no particle succeeded.
    result : SMCResult
        The underlying inference result (particles, weights, history, stats).
    """

    objects: list[tuple[Any, float]]
    texts: list[tuple[str, float]]
    log_ml: float
    result: Any

    def sample(self, rng: np.random.Generator | int | None = None) -> Any:
        """One object drawn from the posterior."""
        if not self.objects:
            raise ValueError("cannot sample: every particle has weight zero (log_ml is -inf)")
        p = np.array([w for _, w in self.objects])
        return self.objects[int(make_rng(rng).choice(len(p), p=p / p.sum()))][0]


def _parser(schema: Any):
    if isinstance(schema, type) and hasattr(schema, "model_validate_json"):
        return schema.model_validate_json  # pydantic v2 model class
    return json.loads


def _canonical(obj: Any) -> str:
    if hasattr(obj, "model_dump_json"):
        return obj.model_dump_json()
    return json.dumps(obj, sort_keys=True)


def generate_json(
    lm: LanguageModel,
    prompt: str | Sequence[int],
    schema: Any,
    n_particles: int = 16,
    seed: int | np.random.Generator | None = None,
    *,
    proposal: str = "mask",
    max_tokens: int | None = 128,
    ess_threshold: float = 0.5,
    resampling: str = "systematic",
) -> StructuredResult:
    """Sample JSON matching ``schema`` from ``lm``'s conditional distribution given validity.

    Parameters
    ----------
    lm : LanguageModel
    prompt : str | Sequence[int]
        The text (or token ids) the JSON continues; apply a chat template yourself if wanted.
    schema : dict | str | type
        JSON Schema (dict or JSON string) or a pydantic model class.
    n_particles : int
        SMC particles N.
    seed : int | numpy.random.Generator | None
    proposal : {"mask", "sample"}
        See :class:`GrammarConstraint`; ``"mask"`` is the efficient one.
    max_tokens : int | None
        Token budget of the JSON text, EOS included.
    ess_threshold, resampling
        Passed to :func:`~llamppl.inference.smc_standard`.

    Returns
    -------
    StructuredResult
    """
    from llamppl.inference import smc_standard

    check_positive_int("n_particles", n_particles)
    model = GrammarConstraint(
        lm, prompt, json_schema=schema, proposal=proposal, max_tokens=max_tokens
    )
    result = run(
        smc_standard(
            model, n_particles, ess_threshold=ess_threshold, resampling=resampling, seed=seed
        )
    )
    parse = _parser(schema)
    texts = list(result.posterior.items())
    merged: dict[str, list] = {}  # texts differing only in whitespace give one object
    for text, w in texts:
        obj = parse(text)
        entry = merged.setdefault(_canonical(obj), [obj, 0.0])
        entry[1] += w
    objects = sorted(((o, w) for o, w in merged.values()), key=lambda ow: -ow[1])
    return StructuredResult(objects=objects, texts=texts, log_ml=result.log_ml, result=result)
