"""``generate_json``: JSON that matches a schema, sampled from the LM's exact conditional by SMC.

Runs :func:`~llamppl.inference.importance_sampling` (or, with ``ess_threshold``,
:func:`~llamppl.inference.smc_standard`) on a
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
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llamppl.decoding.grammar.json_budget import JSONBudget, as_budget
from llamppl.decoding.grammar.json_check import normalize_schema
from llamppl.lm.base import LanguageModel
from llamppl.rng import make_rng
from llamppl.runner import run
from llamppl.validation import check_positive_int

from .grammar import GrammarConstraint

__all__ = [
    "generate_json",
    "generate_json_async",
    "StructuredResult",
    "schema_prompt",
    "SCHEMA_INSTRUCTION",
]

DEFAULT_MAX_TOKENS = 256
SCHEMA_INSTRUCTION = "You need to generate a JSON object that matches the schema below."
"""JSONSchemaBench's zero-shot system message (Geng et al., 2025), used by ``chat=True``."""


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
    failures : dict[str, int]
        Why the final particles with weight zero died (``GrammarConstraint.failure``:
        ``"token limit"``, ``"schema check: ..."``, ...), with counts.
    """

    objects: list[tuple[Any, float]]
    texts: list[tuple[str, float]]
    log_ml: float
    result: Any
    failures: dict[str, int] = field(default_factory=dict)

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


def schema_prompt(lm: LanguageModel, request: str, schema: Any) -> str:
    """The chat-template prompt JSONSchemaBench uses: system instruction, schema in the message.

    The user message is ``request`` (if any) followed by the schema as JSON; the
    assistant turn is opened (``add_generation_prompt=True``).
    """
    if not isinstance(request, str):
        raise TypeError(f"prompt must be a str when chat=True, got {type(request).__name__}")
    tokenizer = getattr(lm, "tokenizer", None)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("chat=True needs an LM whose tokenizer has a chat template")
    schema_text = json.dumps(normalize_schema(schema))
    content = f"{request}\n{schema_text}" if request else schema_text
    messages = [
        {"role": "system", "content": SCHEMA_INSTRUCTION},
        {"role": "user", "content": content},
    ]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def generate_json(
    lm: LanguageModel,
    prompt: str | Sequence[int],
    schema: Any,
    n_particles: int = 16,
    seed: int | np.random.Generator | None = None,
    *,
    proposal: str = "mask",
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    budget: JSONBudget | None = None,
    fast_forward: bool = True,
    predicate: Any = None,
    chat: bool = False,
    ess_threshold: float | None = None,
    resampling: str = "systematic",
    **options: Any,
) -> StructuredResult:
    """Sample JSON matching ``schema`` from ``lm``'s conditional distribution given validity.

    Target: P(y) ∝ p(y EOS | x) 1_valid(y) over the engine's serializations of JSON
    (compact by default), estimated by SMC on :class:`GrammarConstraint`; every
    returned object passed the full ``jsonschema`` check (its final potential).

    Parameters
    ----------
    lm : LanguageModel
    prompt : str | Sequence[int]
        The text (or token ids) the JSON continues; with ``chat=True``, the request
        put before the schema in the user message (may be ``""``).
    schema : dict | str | type
        JSON Schema (dict or JSON string) or a pydantic model class.
    n_particles : int
        SMC particles N.
    seed : int | numpy.random.Generator | None
        Fixes the run (a run option, see ``**options``).
    proposal : {"mask", "sample"}
        See :class:`GrammarConstraint`; ``"mask"`` is the efficient one.
    max_tokens : int | None
        Token budget of the JSON text, EOS included (default 256).
    budget : JSONBudget | None
        The sub-language of JSON the schema is compiled to, as one value
        (:class:`~llamppl.decoding.grammar.json_budget.JSONBudget`: whitespace, characters per
        free string, items per free array, closed objects, decimals per free number; its
        defaults, ``None``, are part of the target, see the docs).
    fast_forward : bool
        Take the tokens the grammar allows alone without a forward pass of their own
        (default True; same target and weights, :class:`GrammarConstraint`).
    predicate : Constraint | Callable[[str], bool] | None
        A further check on the JSON text so far, for example on the values of its fields
        (``grammar & predicate``; a plain callable is checked lazily on the drawn tokens).
    chat : bool
        Build the prompt with the LM's chat template, JSONSchemaBench's instruction
        as system message and the schema in the user message (:func:`schema_prompt`).
    ess_threshold : float | None
        ``None`` (the default): no resampling with ``proposal="mask"`` (importance
        sampling: N independent masked draws, weighted exactly), resampling at ESS < N/2
        with ``proposal="sample"`` (whose particles die on forbidden tokens). A number in
        [0, 1] is the threshold (0: never resample). Under the mask proposal a particle's
        weight is its allowed mass, ≈ 1 inside free strings, so resampling at small N
        collapses onto the particles that then run out of ``max_tokens`` (docs: "Why no
        resampling by default").
    resampling
        The resampling scheme (:mod:`llamppl.inference.resampling`).
    **options
        The run options (:mod:`llamppl.inference.options`): ``progress``, ``record`` (the
        run record on ``.result.record``, for the viewer), ``max_steps``.

    Returns
    -------
    StructuredResult
    """
    return run(
        generate_json_async(
            lm,
            prompt,
            schema,
            n_particles,
            seed,
            proposal=proposal,
            max_tokens=max_tokens,
            budget=budget,
            fast_forward=fast_forward,
            predicate=predicate,
            chat=chat,
            ess_threshold=ess_threshold,
            resampling=resampling,
            **options,
        )
    )


async def generate_json_async(
    lm: LanguageModel,
    prompt: str | Sequence[int],
    schema: Any,
    n_particles: int = 16,
    seed: int | np.random.Generator | None = None,
    *,
    proposal: str = "mask",
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    budget: JSONBudget | None = None,
    fast_forward: bool = True,
    predicate: Any = None,
    chat: bool = False,
    ess_threshold: float | None = None,
    resampling: str = "systematic",
    **options: Any,
) -> StructuredResult:
    """:func:`generate_json` as a coroutine: await it in an event loop, or run many at once.

    The same arguments and result as :func:`generate_json`; runs of several requests
    awaited together (``asyncio.gather``, or ``run_many`` with
    ``Job.call(generate_json_async, prompt, schema, seed=s)``) share the LM's forwards.
    """
    from llamppl.inference import SMC, Never, ess_rule, run_population
    from llamppl.inference.options import options_from

    n = check_positive_int("n_particles", n_particles)
    if not isinstance(chat, bool):
        raise TypeError(f"chat must be a bool, got {type(chat).__name__}")
    budget = as_budget(budget)
    run_opts = options_from("generate_json", {"seed": seed, **options})
    if chat:
        prompt = schema_prompt(lm, prompt, schema)
    model = GrammarConstraint(
        lm,
        prompt,
        json_schema=schema,
        proposal=proposal,
        max_tokens=max_tokens,
        budget=budget,
        fast_forward=fast_forward,
        predicate=predicate,
    )
    if ess_threshold is None and proposal == "mask":
        engine = SMC(Never(), "importance_sampling")
    else:
        threshold = 0.5 if ess_threshold is None else ess_threshold
        engine = SMC(ess_rule(threshold, resampling), "smc_standard")
    result = await run_population(model, n, engine, run_opts)
    failures = dict(Counter(p.failure for p in result.particles if p.failure is not None))
    if result.log_ml == -float("inf"):
        warnings.warn(
            f"generate_json: no particle produced a valid object; causes: {failures}",
            RuntimeWarning,
            stacklevel=2,
        )
    parse = _parser(schema)
    texts = list(result.posterior.items())
    merged: dict[str, list] = {}  # texts differing only in whitespace give one object
    for text, w in texts:
        obj = parse(text)
        entry = merged.setdefault(_canonical(obj), [obj, 0.0])
        entry[1] += w
    objects = sorted(((o, w) for o, w in merged.values()), key=lambda ow: -ow[1])
    return StructuredResult(
        objects=objects, texts=texts, log_ml=result.log_ml, result=result, failures=failures
    )
