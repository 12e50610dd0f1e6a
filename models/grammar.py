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
unknown keywords and formats ignored; :mod:`llamppl.decoding.grammar_compile`), whose
language L' is a superset of the valid texts, the target is still
P(y) ∝ p(y EOS | x) 1_{L'}(y) 1_valid(y) — the LM conditioned on validity (within the
engine's canonical serialization: compact by default, properties in schema order). The mask 1_C(s w) over the whole vocabulary comes from llguidance; EOS is
allowed exactly when the matcher accepts. The masks of all particles in a step
are computed and applied together by
:class:`~llamppl.decoding.grammar_engine.MaskBatcher` (one llguidance call, one
multiplication of the ``(N, V)`` probabilities by the ``(N, V)`` 0/1 masks), and
:class:`MaskedNextToken` draws from the result — the batched counterpart of
:meth:`llamppl.LMContext.mask_dist` followed by ``next_token()``.

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

import asyncio
import copy
import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from llamppl.context import LMContext
from llamppl.decoding.grammar_compile import MAX_ARRAY_ITEMS, MAX_DECIMALS, MAX_STRING_LENGTH
from llamppl.decoding.grammar_engine import (
    Grammar,
    MatcherState,
    allowed_masks,
    forced_token,
    make_grammar,
    mask_batcher,
)
from llamppl.distributions import Distribution
from llamppl.lm.base import LanguageModel
from llamppl.modeling import Model
from llamppl.rng import current_rng
from llamppl.token import Token
from llamppl.validation import check_positive_int

__all__ = ["GrammarConstraint", "MaskedNextToken"]

PROPOSALS = ("mask", "sample")
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


class GrammarConstraint(Model):
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
    proposal : {"mask", "sample"}
        Feynman–Kac formulation (module docstring); same posterior, same Z.
    max_tokens : int | None
        Token budget, EOS included; a particle without EOS by then gets weight zero.
    whitespace : {"compact", "flexible"}
        For ``json_schema``: no whitespace between JSON tokens (default), or JSON's
        free whitespace.
    max_string_length : int | None
        For ``json_schema``: the size budget, characters per free string (default
        32, part of the target; :mod:`llamppl.decoding.schema_budget`); None: unbounded.
    max_array_items : int | None
        For ``json_schema``: items per free array (default 4, same size budget).
    closed_objects : bool
        For ``json_schema``: objects that list ``properties`` get only those keys, and a
        map's keys at most ``max_string_length`` characters (default True, same size
        budget; :mod:`llamppl.decoding.schema_budget`); False: open objects.
    max_decimals : int | None
        For ``json_schema``: decimals per free number, and fewer than 16 integer digits
        where a number has no bound (default 6, same size budget); None: unbounded.
    fast_forward : bool
        With ``proposal="mask"``: take a token the grammar allows alone without a
        forward pass of its own (default True; see "Forced tokens" below). Same
        target, same weights; fewer forward passes.

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
    matcher : MatcherState
        The particle's grammar state (cloned with the particle).
    forced : int
        Tokens this particle took as forced tokens (no draw, no forward of their own).
    failure : str | None
        Why the particle got weight zero: ``"budget"``, ``"schema check: ..."``,
        ``"grammar engine: ..."``, ``"dead end: ..."`` (None while alive).

    Raises
    ------
    ValueError
        For a grammar llguidance cannot compile (even relaxed, for JSON Schemas), or
        one that exceeds its limits at the first token (``_probe_engine_limits``).
    """

    def __init__(
        self,
        lm: LanguageModel,
        prompt: str | Sequence[int],
        grammar: Grammar | None = None,
        *,
        json_schema: Any = None,
        regex: str | None = None,
        lark: str | None = None,
        proposal: str = "mask",
        max_tokens: int | None = 64,
        whitespace: str = "compact",
        max_string_length: int | None = MAX_STRING_LENGTH,
        max_array_items: int | None = MAX_ARRAY_ITEMS,
        closed_objects: bool = True,
        max_decimals: int | None = MAX_DECIMALS,
        fast_forward: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(fast_forward, bool):
            raise TypeError(f"fast_forward must be a bool, got {type(fast_forward).__name__}")
        if proposal not in PROPOSALS:
            raise ValueError(f"proposal must be one of {PROPOSALS}, got {proposal!r}")
        self.grammar = make_grammar(
            grammar,
            json_schema=json_schema,
            regex=regex,
            lark=lark,
            whitespace=whitespace,
            max_string_length=max_string_length,
            max_array_items=max_array_items,
            closed_objects=closed_objects,
            max_decimals=max_decimals,
        )
        self.max_tokens = (
            None if max_tokens is None else check_positive_int("max_tokens", max_tokens)
        )
        self.proposal = proposal
        self.fast_forward = fast_forward
        self.forced = 0
        self.context = LMContext(lm, prompt)
        self.matcher = MatcherState(lm, self.grammar)
        self.failure: str | None = None
        self._batcher = mask_batcher(lm)
        first = allowed_masks(lm, [self.matcher])[0]  # (V,) bool
        if not bool(first.any()):
            warnings.warn(
                f"the {self.grammar.kind} admits no token of this LM's vocabulary as a first token: "
                "every particle will have weight zero (log_ml = -inf)",
                stacklevel=2,
            )
        else:
            _probe_engine_limits(self.matcher, first, lm.eos_token_id)

    async def step(self) -> None:
        ctx = self.context
        lm = ctx.lm
        if self.proposal == "mask":
            forced = self._forced_chain() if self.fast_forward else []
            if forced is None:
                return  # the engine failed on a forced token
            # all k + 1 distributions along s f_1 … f_k in one batched round (trie: one forward)
            paths = [ctx.tokens + forced[:i] for i in range(len(forced) + 1)]
            *before, log_probs = await asyncio.gather(*(lm.next_token_logprobs(p) for p in paths))
            if forced:
                self.score(sum(float(lp[f]) for lp, f in zip(before, forced)))  # singleton G'
                for f in forced:
                    ctx.extend(f)
                self.forced += len(forced)
            last = self.max_tokens is not None and len(ctx.generated) + 1 >= self.max_tokens
            # batched over the step's particles: q = p · 1_C(s w) (EOS iff accepting), G'_t = Σ q
            q, log_mass = await self._batcher.apply(self.matcher, log_probs, final=last)
            if log_mass == -math.inf:  # no allowed token: budget reached unfinished, or dead end
                self._die("budget" if last else "dead end: the grammar allows no token here")
                return
            self.score(log_mass)  # G'_t = allowed mass
            token = await self.sample(MaskedNextToken(ctx, q, log_mass))  # M'_t = q / G'_t
            if token == lm.eos_token_id:
                self._end()
            elif not self.matcher.consume(int(token)):
                self._die_in_engine(int(token))
            return
        last = self.max_tokens is not None and len(ctx.generated) + 1 >= self.max_tokens
        token = await self.sample(ctx.next_token())  # M_t = p
        if token == lm.eos_token_id:
            if not self.matcher.accepting:  # G_t = 1_L(s)
                self._die("EOS before the grammar accepts")
            else:
                self._end()
        elif last:
            self._die("budget")
        elif not self.matcher.allows(int(token)):  # G_t = 1_C(s w)
            self._die("token outside the grammar")
        elif not self.matcher.consume(int(token)):
            self._die_in_engine(int(token))

    def _forced_chain(self) -> list[int] | None:
        """Consume the tokens the grammar allows alone from here (class docstring, "Forced tokens").

        A token is forced when the mask allows exactly it and not EOS
        (:func:`~llamppl.decoding.grammar_engine.forced_token`). None if the engine
        failed on one (the particle is dead).
        """
        forced: list[int] = []
        state = self.matcher
        room = None if self.max_tokens is None else self.max_tokens - len(self.context.generated)
        while room is None or len(forced) + 1 < room:
            token = forced_token(state)
            if token is None:
                break
            forced.append(token)
            if not state.consume(token):
                self._die_in_engine(token)
                return None
        return forced

    def _end(self) -> None:
        """EOS after an accepted text: the final potential 1_valid(y) for JSON Schemas."""
        check = self.grammar.check
        if check is not None and not check(self.text):
            self._die(f"schema check: {check.last_error}")
        self.finish()

    def _die(self, cause: str) -> None:
        self.failure = cause
        self.condition(False)

    def _die_in_engine(self, token_id: int) -> None:
        error = self.matcher.engine_error or "the engine rejected a token it allowed"
        cause = f"grammar engine: {error.splitlines()[0]}"
        if cause not in _WARNED:
            _WARNED.add(cause)
            warnings.warn(
                f"llguidance failed after token {token_id} ({cause}); the particle gets weight "
                "zero. A grammar with no finite string or a very large schema does this.",
                RuntimeWarning,
                stacklevel=2,
            )
        self._die(cause)

    @property
    def text(self) -> str:
        """The generated text without EOS."""
        ids = self.context.generated
        if ids and ids[-1] == self.context.lm.eos_token_id:
            ids = ids[:-1]
        return self.context.lm.decode(ids)

    def string_for_serialization(self) -> str:
        """The generated text (without EOS): the posterior key."""
        return self.text


class MaskedNextToken(Distribution):
    """The token-masking proposal M'_t = q / G'_t from precomputed masked probabilities.

    The batched counterpart of ``context.mask_dist(mask)`` + ``context.next_token()``
    (:mod:`llamppl.context`): ``q`` (``(V,)``, unnormalised, zero outside the mask)
    and ``log G' = log Σ q`` come from one batched
    :func:`~llamppl.decoding.grammar_engine.apply_masks` for all particles of the
    step. Sampling or observing a token extends the context.
    """

    def __init__(self, context: LMContext, q: torch.Tensor, log_mass: float) -> None:
        self.context, self.q, self.log_mass = context, q, log_mass

    async def sample(self, rng=None):
        cdf = torch.cumsum(self.q, dim=0)  # (V,)
        u = float((rng or current_rng()).random()) * float(cdf[-1])
        i = int(
            torch.searchsorted(
                cdf, torch.tensor([u], dtype=cdf.dtype, device=cdf.device), right=True
            )
        )
        i = min(i, cdf.numel() - 1)
        if self.q[i] <= 0:  # u on the float boundary at the very top: the last allowed token
            i = int(torch.nonzero(self.q > 0)[-1])
        return await self._take(i)

    async def log_prob(self, value):
        return (await self._take(int(value)))[1]

    async def _take(self, i: int):
        self.context.extend(i)
        p = float(self.q[i])
        return Token(self.context.lm, i), (math.log(p) - self.log_mass if p > 0 else -math.inf)

    async def support(self):
        ids = torch.nonzero(self.q > 0).flatten().tolist()
        return [
            (Token(self.context.lm, i), math.log(float(self.q[i])) - self.log_mass) for i in ids
        ]
