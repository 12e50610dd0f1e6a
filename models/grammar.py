"""``GrammarConstraint``: LM output conditioned on a grammar (JSON Schema, regex or Lark), exactly.

Let p be the LM after the prompt x and L the grammar's language. The target is
the LM's output conditioned on membership in L::

    P(y) ∝ p(y EOS | x) · 1_L(y),   Z = Σ_{y ∈ L} p(y EOS | x) = P(valid)

(restricted to at most ``max_tokens`` generated tokens, EOS included, when
``max_tokens`` is set: a particle that reaches the budget without EOS gets
weight zero). Write C for the prefixes of L (prefixes from which the engine
allows a continuation) and s_{t-1} for the tokens so far. The two Feynman–Kac
formulations of the LLaMPPL paper (§2.2, as in
:mod:`llamppl.models.hard_constraints`) are:

``proposal="sample"`` — sample, then condition::

    M_t(w | s_{t-1}) = p(w | x s_{t-1}),   G_t = 1_C(s_{t-1} w)   (EOS: 1_L(s_{t-1}))

``proposal="mask"`` — token masking with the allowed mass as potential::

    M'_t(w | s_{t-1}) = p(w | x s_{t-1}) 1_C(s_{t-1} w) / G'_t
    G'_t             = Σ_w p(w | x s_{t-1}) 1_C(s_{t-1} w)

Both give the same posterior and the same Z (M'_t G'_t = M_t G_t token by
token). For a JSON Schema a final potential multiplies in at EOS::

    G_final = 1_valid(y)   (full ``jsonschema`` validation, the schema's own draft)

so when llguidance only compiles a *relaxed* grammar (``oneOf`` read as ``anyOf``,
unknown keywords and formats ignored; :mod:`llamppl.decoding.grammar.compile`), whose
language L' is a superset of the valid texts, the target is still
P(y) ∝ p(y EOS | x) 1_{L'}(y) 1_valid(y) — the LM conditioned on validity (within the
engine's canonical serialization: compact by default, properties in schema order). The mask 1_C(s w) over the whole vocabulary comes from llguidance; EOS is
allowed exactly when the matcher accepts and the final check passes (the complete
check of :class:`~llamppl.decoding.grammar.compile.Grammar`). The masks of all
particles in a step are computed and applied together (one llguidance call, one
multiplication of the ``(N, V)`` probabilities by the ``(N, V)`` 0/1 masks), and
:class:`~llamppl.decoding.proposals.constrained_tokens.MaskedNextToken` draws from the result.

``GrammarConstraint`` is :class:`~llamppl.models.HardConstraint` with a grammar as
its constraint (the same program: proposals, endings, time bound); ``predicate=``
adds a Python check on the text, for example on the values of a JSON object
(``grammar & predicate``, checked lazily on the tokens drawn). A text cut at
``max_tokens`` gets weight zero by default (``truncated="drop"``: the target is the
LM's own EOS-terminated outputs).

*Local masking* (the mask proposal without G'_t — what Outlines, XGrammar, vLLM
and HF ``generate`` with :class:`~llamppl.models.GrammarLogitsProcessor` do)
samples a distorted distribution; ``enumerate_exact`` of this program, or SMC
with enough particles, gives the exact conditional::

    from llamppl import CachedCausalLM, run
    from llamppl.inference import smc_standard
    from llamppl.models import GrammarConstraint
    lm = CachedCausalLM.default()
    model = GrammarConstraint(lm, "Answer: ", regex=r"(yes|no)\\.", max_tokens=8)
    result = run(smc_standard(model, n_particles=8, seed=0))
    print(result.log_ml, result.posterior)
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from llamppl.decoding.constraints.time_bound import DEFAULT_CHECK_TIMEOUT
from llamppl.decoding.grammar.engine import Grammar, MatcherState, allowed_masks, make_grammar
from llamppl.decoding.grammar.json_budget import JSONBudget
from llamppl.decoding.proposals.constrained_tokens import MaskedNextToken
from llamppl.lm.base import LanguageModel

from .hard_constraints import HardConstraint

__all__ = ["GrammarConstraint", "MaskedNextToken"]

_WARNED: set[str] = set()


def _probe_engine_limits(state: MatcherState, first: torch.Tensor, eos: int) -> None:
    """Refuse a grammar the engine cannot run past its first token (``ValueError`` naming the cause).

    On a copy of the matcher, the lowest-id allowed token is consumed; llguidance's
    resource limits ("Too many items": a grammar with no finite string such as
    ``a: "x" a``, or a schema with thousands of optional properties) show up there.
    """
    allowed = first.clone()
    allowed[eos] = False
    ids = torch.nonzero(allowed).flatten()
    if ids.numel() == 0:
        return
    probe = copy.deepcopy(state)
    probe.consume(int(ids[0]))
    if probe.engine_error:
        raise ValueError(
            f"the {state.grammar.kind} exceeds the grammar engine's limits at its first token "
            f"(llguidance says: {probe.engine_error.splitlines()[0]}); typical causes are a "
            'grammar with no finite string (only recursive rules, e.g. a: "x" a) or a '
            "schema too large for the engine (e.g. thousands of optional properties)"
        )


class GrammarConstraint(HardConstraint):
    """LM continuation of ``prompt`` conditioned on lying in a grammar's language.

    Parameters
    ----------
    lm : LanguageModel
    prompt : str | Sequence[int]
        Text or token ids to continue (as in :class:`~llamppl.LMContext`).
    grammar : Grammar, optional
        A compiled grammar; or give exactly one of the next three.
    json_schema : dict | str | type, optional
        JSON Schema as a dict, a JSON string, or a pydantic model class.
    regex : str, optional
        Regular expression the whole output must match.
    lark : str, optional
        Lark grammar (llguidance dialect, rule ``start``).
    predicate : Constraint | Callable[[str], bool], optional
        A further constraint on the text (``grammar & predicate``).
    proposal : {"auto", "mask", "lazy", "sample"}
        Feynman–Kac formulation (:class:`~llamppl.models.HardConstraint`); same posterior,
        same Z. ``"auto"``: the mask, or the lazy draw when ``predicate`` has no cheap mask.
    max_tokens : int | None
        Token budget, EOS included; a particle without EOS by then gets weight zero
        (``truncated="drop"``, the default; see :class:`~llamppl.models.HardConstraint`).
    budget : JSONBudget | None
        For ``json_schema``: the JSON budget, one value
        (:class:`~llamppl.decoding.grammar.json_budget.JSONBudget`: whitespace, characters per
        free string, items per free array, closed objects, decimals per free number; part of
        the target). ``None``: compact whitespace, 32 characters per free string, 4 items per
        free array, closed objects, 6 decimals per free number.
    fast_forward : bool
        Take a token the grammar allows alone without a forward pass of its own
        (default True; see "Forced tokens" below). Same target, same weights.
    stop, truncated, check_timeout
        As for :class:`~llamppl.models.HardConstraint` (here ``truncated="drop"``).

    Forced tokens
    -------------
    When the mask at s allows exactly one token f (not EOS), M'(f) = 1 and
    G' = p(f | x s): the step needs p(f | x s), not a draw. With ``fast_forward``
    the particle consumes such a chain f_1 … f_k in the grammar before asking the
    LM, then requests the k + 1 next-token distributions along s f_1 … f_k
    together; the LM's trie runs the k new tokens in the same forward pass as the
    other particles' tokens. The step scores Σ_i log p(f_i | x s f_<i) (the k
    singleton steps' G') and then draws the next token as usual, so the weights
    and the target are those of the token-by-token program. A chain stops before
    the last position of ``max_tokens``, where only EOS may come.

    Attributes
    ----------
    context : LMContext
    grammar : Grammar
    matcher : MatcherState
        The particle's grammar state (cloned with the particle).
    forced : int
        Tokens this particle took as forced tokens (no draw, no forward of their own).
    failure : str | None
        Why the particle got weight zero: ``"token limit"``, ``"schema check: ..."``,
        ``"grammar engine: ..."``, ``"no allowed token"``, ... (None while alive).

    Raises
    ------
    ValueError
        For a grammar llguidance cannot compile (even relaxed, for JSON Schemas), or
        one that exceeds its limits at the first token (``_probe_engine_limits``).
    """

    constraint_noun = "grammar"

    def __init__(
        self,
        lm: LanguageModel,
        prompt: str | Sequence[int],
        grammar: Grammar | None = None,
        *,
        json_schema: Any = None,
        regex: str | None = None,
        lark: str | None = None,
        predicate: Any = None,
        proposal: str = "auto",
        max_tokens: int | None = 64,
        budget: JSONBudget | None = None,
        fast_forward: bool = True,
        stop: str = "eos",
        truncated: str = "drop",
        check_timeout: float | None = DEFAULT_CHECK_TIMEOUT,
    ) -> None:
        self.grammar = make_grammar(
            grammar,
            json_schema=json_schema,
            regex=regex,
            lark=lark,
            budget=budget,
        )
        constraint = self.grammar
        if self.grammar.prefix_checks is not None:  # string patterns the grammar dropped
            constraint = constraint & self.grammar.prefix_checks
        if predicate is not None:
            constraint = constraint & predicate
        super().__init__(
            lm,
            prompt,
            constraint,
            proposal,
            max_tokens,
            stop=stop,
            truncated=truncated,
            check_timeout=check_timeout,
            fast_forward=fast_forward,
        )
        first = allowed_masks(lm, [self.matcher])[0]  # (V,) bool
        if not bool(first.any()):
            warnings.warn(
                f"the {self.grammar.kind} admits no token of this LM's vocabulary as a first token: "
                "every particle will have weight zero (log_ml = -inf)",
                stacklevel=2,
            )
        else:
            _probe_engine_limits(self.matcher, first, lm.eos_token_id)

    @property
    def matcher(self) -> MatcherState:
        """The particle's grammar matcher (part of the constraint's state)."""
        if self.constraint is self.grammar:
            return self.state
        return self.state[self.constraint.parts.index(self.grammar)]

    def die(self, cause: str) -> None:
        if cause.startswith("grammar engine") and cause not in _WARNED:
            _WARNED.add(cause)
            warnings.warn(
                f"llguidance failed ({cause}); the particle gets weight zero. A grammar with "
                "no finite string or a very large schema does this.",
                RuntimeWarning,
                stacklevel=3,
            )
        super().die(cause)

    def string_for_serialization(self) -> str:
        """The generated text (without EOS): the posterior key."""
        return self.text
