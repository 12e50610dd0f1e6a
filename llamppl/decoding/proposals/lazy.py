"""Lazy exact token proposals: adaptive weighted rejection sampling (AWRS) with an unbiased weight.

The token-masking proposal of the LLaMPPL paper (§2.2) needs the allowed set
A = {w : s·w ∈ C} over the whole vocabulary before it draws: one check per token,
49,152 calls of a user's predicate per particle per step. The lazy proposal checks
only the tokens it draws (Lipkin et al., COLM 2025, "Fast Controlled Generation
from Language Models with Adaptive Weighted Rejection Sampling"; the estimator and
its proof below are our own derivation), and gives SMC the same target:

**Draw (adaptive rejection, without replacement).** Visit the tokens in the order
of sampling without replacement from p = p(· | x s) — the order of the keys
log p(w) + Gumbel noise, largest first (the Gumbel-top-k trick, Kool et al. 2019) —
and check each; the first allowed one is a. A rejected token is removed from the
distribution, which leaves the relative probabilities of the allowed tokens
unchanged, so a ~ p(· | A) = p(w) 1_A(w) / Z with Z = Σ_{w∈A} p(w): exactly the
masked proposal M'_t.

**Weight (a few more checks).** Continue in the same order after a: b_1, b_2, …,
each a draw from p restricted to the tokens not yet seen. Before checking b_j, write
K_j for the mass known to be allowed (p(a) plus the allowed b_i, i < j) and u_j for
the unseen mass (Σ p over the tokens not yet seen). A rule that looks only at what was
seen before b_j decides whether b_j is the last check (here: u_j ≤ 5 % of K_j, or j = 8).
With b_m the last one, the weight is

    Ẑ = K_m + u_m · 1_A(b_m)                                           (AWRS weight)

(Ẑ = K_m exactly when every token of positive probability has been seen).

*Unbiasedness.* Write F_j for everything seen before b_j (the rejections R, a, b_1 …
b_{j−1} and their probabilities). Given F_j, b_j is drawn from p restricted to the
unseen tokens, so E[u_j 1_A(b_j) | F_j] = Σ_{w unseen} p(w) 1_A(w) = Z − K_j (no
allowed token lies in R). So if b_j is the last check, E[Ẑ | F_j] = K_j + Z − K_j = Z;
if it is not, K_{j+1} = K_j + p(b_j) 1_A(b_j) and, by induction on the checks left,
E[Ẑ | F_j] = E[E[Ẑ | F_{j+1}] | F_j] = Z. Hence E[Ẑ | F_1] = Z whatever F_1 is.

*Proper weighting.* a is a function of F_1 and a ~ p(· | A), so for any f,
E[Ẑ f(a)] = E[f(a) E[Ẑ | F_1]] = Z E[f(a)] = Σ_{w∈A} p(w) f(w). The pair (a, Ẑ) is
properly weighted for the target p(w) 1_A(w): SMC weights stay exact in
expectation, and with them the unbiased estimate of the normalising constant, as
with the mask's G'_t = Z (M'_t G'_t = p 1_A token by token).

*Nothing allowed.* If every token of positive probability is rejected, Z = 0
exactly and the weight is 0 (``LazyDraw.token is None``): the particle dies with
a named cause. Scanned token by token, that costs one check per token, as the mask
does; the next paragraph avoids it.

*Long runs of rejections.* A state that allows few tokens, or none, makes the scan
visit token after token: when Z = 0 every token of positive probability must be seen
before the weight is known to be 0. Once a draw has rejected ``EXHAUST_AFTER`` tokens
in a row it asks ``exhaust`` for the whole allowed set A (a text constraint lists it
with its prefix check on the vocabulary's trie, :mod:`~llamppl.decoding.proposals.vocab_trie`,
at a small fraction of the checks), within a budget of as many checks as the draw
has made; past the budget it scans on, and once its checks have doubled the listing
goes on where it stopped. Once A is known the draw is exact: a is still the first token of A in the
same order (the token the scan would have accepted, so a ~ p(· | A)) and the weight
is Z = Σ_{w∈A} p(w) itself, or the particle dies when A is empty. Whether the draw
switches is decided before a is seen, and in both branches the weight has conditional
mean Z given that decision and a (the exact Z; E[Ẑ | F_1] = Z above), so
E[w f(a)] = Z E[f(a)] = Σ_{w∈A} p(w) f(w) still holds.

The listing may find fewer tokens than the scan accepts, A' ⊊ A, when the check is sound
(it rejects a text only when no completion of it passes) but not closed under prefixes:
COLLIE's word checks reject ``praisit`` but not ``praisité``, so the token ``ité`` after
``prais`` is in A and not in A'. The listed branch then draws a ∝ p on A' with weight
p(A'): E[w 1{a=w}] is p(w) for w ∈ A' as before, and less than p(w) for w ∈ A − A'. Every
such w leads to texts no completion of which passes, whose final weight is 0 either way,
so the run's Ẑ and posterior keep their expectations (``tests/models/
test_lazy_constraints.py``, ``test_a_sound_check_not_closed_under_prefixes_...``).

*Variance.* Given F_m, Var[Ẑ] = u_m² φ (1 − φ) with φ the allowed fraction of the
unseen mass: the stopping rule keeps u_m at most 5 % of the known allowed mass unless
eight extra checks did not get there, so the weight's relative error is a few percent
when the LM puts its mass on few tokens, at one to a few extra checks per step.

**Hints.** A constraint may name tokens that write what it asks for next
(``Constraint.hint``: the first token of a required word when it is due), which the LM
alone may rarely propose. :func:`lazy_draw` mixes them in exactly: with H the allowed
hints (checked first), P_H = Σ_{h∈H} p(h) and β = ``hint_prob`` < 1, it draws h ∝ p(h)
on H with weight P_H / β with probability β, and otherwise runs AWRS for A − H (the
hints count as rejected) with weight Ẑ_rest / (1 − β). For any f,
E[w f(a)] = β Σ_{h∈H} (p(h) / P_H)(P_H / β) f(h) + (1 − β) E[Ẑ_rest f(a)] / (1 − β)
= Σ_{w∈A} p(w) f(w): properly weighted again (β = 1 would lose A − H).

**Batched.** :func:`top_candidates` perturbs the ``(B, V)`` log-probs of every
particle of a step with Gumbel noise (each row's from a seed its own run's stream
draws, so a run's draws do not depend on the runs served beside it) and returns each
row's first ``k`` tokens in key order with their log-probs, in ONE host read; only
the checks run per particle (:func:`awrs`), in Python. A particle that needs more
than ``k`` candidates reads the next ones from its own row (:class:`Candidates`)::

    cands = await next_candidates(log_probs, rng)      # coalesced across particles
    draw = awrs(cands, lambda w: constraint_allows(w))
    draw.token, draw.log_weight, draw.calls
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from llamppl.batching import Coalescer

__all__ = [
    "EXHAUST_AFTER",
    "FIRST_CANDIDATES",
    "Candidates",
    "LazyDraw",
    "awrs",
    "lazy_draw",
    "next_candidates",
    "top_candidates",
]

#: Candidates read per row in the batched round (the rest on demand, per particle).
FIRST_CANDIDATES = 32
#: Checks after the accepted token at most, and the unseen mass (relative to the mass known to
#: be allowed) below which the next check is the last one (the weight's stopping rule).
MAX_EXTRA_CHECKS = 8
REL_TOL = 0.05
#: Rejections in a row after which a draw asks for the whole allowed set (when it can be listed).
EXHAUST_AFTER = 64

#: ``exhaust(budget) -> (allowed token ids or None past the budget, checks made)``.
Exhaust = Callable[[int], tuple["list[int] | None", int]]


class Candidates:
    """One row's tokens in the order of sampling without replacement from ``softmax(row)``.

    ``ids``/``log_probs`` hold the first candidates (read in the batched round); iterating
    continues past them by re-ranking the row's keys on its device (``4×`` more each time).
    ``total`` is Σ_w p(w) of the row in float64 (1 up to the row's rounding), the mass the
    unseen mass is computed from.
    """

    def __init__(
        self,
        ids: list[int],
        log_probs: list[float],
        total: float,
        keys: torch.Tensor | None = None,
        row: torch.Tensor | None = None,
    ) -> None:
        self.ids, self.log_probs, self.total = ids, log_probs, total
        self._keys, self._row = keys, row  # (V,) on the device, for more candidates
        self.reads = 1

    def __iter__(self) -> Iterator[tuple[int, float]]:
        i = 0
        while True:
            if i == len(self.ids) and not self._more():
                return
            lp = self.log_probs[i]
            if lp == -math.inf:  # only zero-probability tokens remain
                return
            yield self.ids[i], lp
            i += 1

    def log_probs_of(self, ids: list[int]) -> list[float]:
        """The row's log-probabilities of ``ids`` (one host read)."""
        if self._row is None:
            raise ValueError("these candidates keep no row to read log-probabilities from")
        index = torch.as_tensor(ids, dtype=torch.long, device=self._row.device)
        return self._row.gather(0, index).double().tolist()

    def _more(self) -> bool:
        """Read the next candidates of this row (one host read); False when none is left."""
        keys = self._keys
        if keys is None or len(self.ids) >= keys.numel():
            return False
        k = min(keys.numel(), 4 * len(self.ids))
        values, order = torch.topk(keys, k)  # (k,), largest first: the same order, extended
        lps = self._row.gather(0, order)
        start = len(self.ids)
        new_ids = order[start:].tolist()
        new_lps = lps[start:].double().tolist()
        self.reads += 1
        if not new_ids:
            return False
        self.ids += new_ids
        self.log_probs += new_lps
        return True


def top_candidates(
    rows: torch.Tensor, seed: int | Sequence[int], k: int = FIRST_CANDIDATES
) -> list[Candidates]:
    """Each row's first ``k`` tokens in Gumbel-key order, for all rows in one tensor pass.

    ``rows`` is ``(B, V)`` log-probabilities (normalised or not; ``-inf`` for impossible
    tokens) on any device; ``seed`` fixes the Gumbel noise (a ``torch.Generator`` on that
    device): one seed for the batch, or one per row (then a row's noise does not depend on
    the rows beside it). One host read brings back the ``(B, k)`` ids, their log-probs and
    the rows' masses.
    """
    B, V = rows.shape
    if isinstance(seed, Sequence):
        if len(seed) != B:
            raise ValueError(f"seed must be one int or one per row ({B}), got {len(seed)}")
        u = torch.stack([_uniforms(rows.device, int(s), V) for s in seed])  # (B, V)
    else:
        gen = torch.Generator(device=rows.device).manual_seed(int(seed))
        u = torch.rand((B, V), generator=gen, device=rows.device, dtype=torch.float64)
    u = u.clamp_(min=torch.finfo(torch.float64).tiny)
    keys = rows.double() - torch.log(-torch.log(u))  # (B, V): log p + Gumbel(0, 1)
    k = min(k, V)
    _, order = torch.topk(keys, k, dim=1)  # (B, k) token ids, largest key first
    lps = rows.gather(1, order).double()  # (B, k)
    total = torch.logsumexp(rows.double(), dim=1).exp()  # (B,)
    host = torch.cat([order.double(), lps, total[:, None]], dim=1).cpu()  # ONE host read
    out = []
    for b in range(B):
        ids = [int(x) for x in host[b, :k].tolist()]
        out.append(
            Candidates(ids, host[b, k : 2 * k].tolist(), float(host[b, -1]), keys[b], rows[b])
        )
    return out


def _uniforms(device: torch.device, seed: int, n: int) -> torch.Tensor:
    """``(n,)`` float64 uniforms in [0, 1) from their own generator seeded with ``seed``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.rand(n, generator=gen, device=device, dtype=torch.float64)


@dataclass(frozen=True)
class LazyDraw:
    """What one lazy draw found.

    Attributes
    ----------
    token : int | None
        The accepted token a ~ p(· | A), or None when no token is allowed (Z = 0).
    log_weight : float
        log Ẑ (the AWRS weight; ``-inf`` when no token is allowed).
    log_p : float
        log p(a) (``-inf`` when none).
    calls : int
        Checks made (rejections + the accepted token + the weight's extra check).
    """

    token: int | None
    log_weight: float
    log_p: float
    calls: int


def awrs(
    candidates: Candidates,
    allowed: Callable[[int], bool],
    max_extra: int = MAX_EXTRA_CHECKS,
    rel_tol: float = REL_TOL,
    exhaust: Exhaust | None = None,
) -> LazyDraw:
    """Adaptive weighted rejection sampling over ``candidates`` (module docstring, AWRS weight).

    ``allowed(w)`` is the check of token ``w`` (True: s·w may still be completed); it is
    called once per candidate visited, never twice for the same token. After the accepted
    token the weight checks up to ``max_extra`` more candidates: each but the last adds its
    exact mass when allowed, and the last (taken once the unseen mass u is at most
    ``rel_tol`` times the mass known to be allowed, or at ``max_extra``) adds u 1_A(b)
    (the estimator of the module docstring, with a stopping rule decided before each check).

    ``exhaust(budget)``, when given, lists the whole allowed set A with at most ``budget``
    checks, or returns None past it (module docstring, "Long runs of rejections"); it is
    tried after ``EXHAUST_AFTER`` rejections in a row, then each time the draw's checks double.
    """
    stream = iter(candidates)
    rejected, calls = 0.0, 0
    accepted: tuple[int, float] | None = None
    attempt = EXHAUST_AFTER
    for w, lp in stream:
        calls += 1
        if allowed(w):
            accepted = (w, lp)
            break
        rejected += math.exp(lp)
        if exhaust is not None and calls >= attempt:
            attempt *= 2
            found, checks = exhaust(calls)
            calls += checks
            if found is not None:
                return _exact_draw(candidates, stream, found, calls)
    if accepted is None:
        return LazyDraw(None, -math.inf, -math.inf, calls)
    a, lp_a = accepted
    known = math.exp(lp_a)  # mass known to be allowed
    seen = rejected + known
    for j in range(1, max_extra + 1):
        unseen = candidates.total - seen  # u = Σ_{w unseen} p(w)
        if unseen <= 0:
            break
        nxt = next(stream, None)
        if nxt is None:  # every token of positive probability is known: Ẑ = Z exactly
            break
        b, lp_b = nxt
        calls += 1
        ok = allowed(b)
        if j == max_extra or unseen <= rel_tol * known:  # the last check: u 1_A(b)
            known += unseen if ok else 0.0
            break
        p_b = math.exp(lp_b)
        known += p_b if ok else 0.0
        seen += p_b
    return LazyDraw(a, math.log(known), lp_a, calls)


def _exact_draw(
    candidates: Candidates, stream: Iterator[tuple[int, float]], found: list[int], calls: int
) -> LazyDraw:
    """The draw once A = ``found`` is known: a is the first token of A in the candidates'
    order (the token the scan would have accepted) and the weight is Z itself."""
    log_probs = candidates.log_probs_of(found)
    allowed = {w: lp for w, lp in zip(found, log_probs) if lp > -math.inf}
    if not allowed:
        return LazyDraw(None, -math.inf, -math.inf, calls)
    log_z = float(np.logaddexp.reduce(np.array(list(allowed.values()))))
    for w, lp in stream:  # no checks: membership in A is known
        if w in allowed:
            return LazyDraw(w, log_z, lp, calls)
    raise AssertionError("an allowed token of positive probability is missing from the order")


# ---------------------------------------------------------------- batched candidate reads
# A request is (row, rng): the (V,) log-probs of one particle and the run's generator.
_COALESCERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _serve(requests: list[tuple[torch.Tensor, np.random.Generator]]) -> list[Candidates]:
    """All pending requests in one :func:`top_candidates` pass per device."""
    out: list[Candidates | None] = [None] * len(requests)
    by_device: dict[torch.device, list[int]] = {}
    for i, (row, _) in enumerate(requests):
        by_device.setdefault(row.device, []).append(i)
    for idx in by_device.values():
        # each row's noise from its own run's stream: a draw does not depend on the draws of
        # other runs served in the same round (jobs run at once, run_many)
        seeds = [int(requests[i][1].integers(2**62)) for i in idx]
        rows = torch.stack([requests[i][0] for i in idx])  # (B, V)
        for i, cand in zip(idx, top_candidates(rows, seeds)):
            out[i] = cand
    return out  # type: ignore[return-value]


def _coalescer() -> Coalescer:
    loop = asyncio.get_running_loop()
    c = _COALESCERS.get(loop)
    if c is None:
        c = _COALESCERS[loop] = Coalescer(_serve)
    return c


async def next_candidates(row: torch.Tensor, rng: np.random.Generator) -> Candidates:
    """This particle's candidates for a lazy draw from ``row`` (``(V,)`` log-probs); the
    requests of all particles awaiting at once are served in one batched pass."""
    return await _coalescer().submit((row, rng))


async def lazy_draw(
    row: torch.Tensor,
    allowed: Callable[[int], bool],
    rng: np.random.Generator,
    hints: list[tuple[int, float]] | None = None,
    hint_prob: float = 0.0,
    exhaust: Exhaust | None = None,
) -> LazyDraw:
    """One lazy draw from ``row`` (``(V,)`` log-probs): :func:`awrs`, or with ``hints``
    (allowed tokens and their log-probs, once each) the hint mixture of the module
    docstring, its branch's probability folded into ``log_weight``. ``hint_prob`` in [0, 1).
    ``exhaust`` lists the allowed set after long runs of rejections (:func:`awrs`)."""
    if not hints or not hint_prob:
        return awrs(await next_candidates(row, rng), allowed, exhaust=exhaust)
    lps = np.array([lp for _, lp in hints])
    log_mass = float(np.logaddexp.reduce(lps))  # log P_H
    if rng.random() < hint_prob:  # the hint branch: h ∝ p(h) on H, weight P_H / β
        probs = np.exp(lps - log_mass)
        h, lp_h = hints[int(rng.choice(len(hints), p=probs / probs.sum()))]
        return LazyDraw(h, log_mass - math.log(hint_prob), lp_h, 0)
    hinted = {h for h, _ in hints}
    rest = None
    if exhaust is not None:

        def rest(budget: int) -> tuple[list[int] | None, int]:
            found, checks = exhaust(budget)
            return (None if found is None else [w for w in found if w not in hinted]), checks

    cands = await next_candidates(row, rng)
    draw = awrs(cands, lambda w: w not in hinted and allowed(w), exhaust=rest)
    return LazyDraw(draw.token, draw.log_weight - math.log1p(-hint_prob), draw.log_p, draw.calls)
