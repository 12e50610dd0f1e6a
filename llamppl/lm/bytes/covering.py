"""The covering of a byte prefix and its beam: the state behind :class:`~llamppl.lm.bytes.ByteLM`.

Vieira et al., "From Language Models over Tokens to Language Models over Characters"
(ICML 2025, arXiv 2412.03719; ``papers.md`` §7). A token LM p gives every token string
t = t_1 … t_n a probability p(t) = ∏_i p(t_i | t_<i); ``bytes(t)`` joins the tokens'
bytes (``lm.byte_vocab``). The probability that the text starts with the bytes σ sums p
over the *covering* of σ,

    P(σ) = Σ_{t ∈ C(σ)} p(t),
    C(σ) = { t·w : bytes(t·w) starts with σ, bytes(t) is a proper prefix of σ },

with P(ε) = 1. The covering strings that share t share the bytes u = σ[|bytes(t)|:] their
last token w starts with, so they are summed in one :class:`Element` (t, u) of weight

    W(t, u) = p(t) · M_t(u),      M_t(u) = Σ_{w: bytes(w) starts with u} p(w | t),

read off the sorted vocabulary (the tokens that start with u are one range of it; a
vocabulary trie). Then P(σ) = Σ_{(t,u)} W(t, u), and the covering of σ·b follows exactly:

- (t, u) becomes (t, u·b), of weight p(t) M_t(u·b), the tokens that go on with b;
- if u is itself a token, t·u *ends at* σ: the element (t·u, ε) of weight p(t) p(u | t)
  (its *closure*) becomes (t·u, b), of weight p(t·u) M_{t·u}(b); it needs the LM's
  next-token distribution after t·u (one request).

The next byte's distribution is the ratio P(b | σ) = P(σ·b) / P(σ), and the end of the
text has P_end(σ) = Σ_{(t, ε)} p(t) Σ_{e ∈ EOS} p(e | t). Both come from one ``(E, 258)``
table of masses per covering (:func:`element_masses`: for each element, the mass of the
tokens that go on with each byte, the end, and the tokens outside the byte view), built
with one ``index_add`` for all elements.

The exact covering (every element) grows with |σ| and the vocabulary. The *beam* keeps the
K elements of largest weight after each byte, and the closures of the kept ones (a closure
is part of its element's mass, so it never competes with it). An element holds a whole
range of tokens (`` c…``) while the byte is inside a token, so the beam is over spellings
up to the last token boundary, not over single tokens; its
next-byte distribution, normalised over the 257 outcomes, is itself a proper language
model over bytes, and its P(σ) a lower bound.

Tokens that add no text are outside the byte view: the end tokens (the end outcome), and
tokens of no bytes or marked special by the tokenizer (BOS, ``<|im_start|>``), the
*excluded* tokens X. The byte view is the token LM that never draws them: at every token
boundary the next-token distribution is renormalised over the others,

    p̃(w | t) = p(w | t) / (1 − p(X | t))   for w ∉ X,

and p̃ replaces p everywhere above (P(σ), the masses M, the end). Then for every prefix
Σ_b P(σ·b) + P_end(σ) = P(σ) exactly (each element's masses over the 256 bytes and the end
add up to its weight), so the chain of next-byte probabilities multiplies out to P(σ):
``prefix_logprob`` and ``next_byte_logprobs`` describe one distribution, the text of p̃.
Without excluded mass p̃ = p. (Dropping X's mass instead and normalising only the next-byte
distribution would give each element's mass a different denominator, a next-byte
distribution whose chain is not P(σ).)
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..base import LanguageModel
from ..memo import LRU, lm_table

__all__ = [
    "EOS_BYTE",
    "ByteTables",
    "Covering",
    "Element",
    "byte_tables",
    "element_masses",
    "excluded_ids",
    "extend_covering",
    "next_byte_logprobs",
    "root_covering",
]

#: Index of the end-of-text outcome in a next-byte distribution (bytes are 0..255).
EOS_BYTE = 256
_EXCLUDED = 257  # bin of the tokens outside the byte view
_BINS = 258


@dataclass
class Element:
    """The covering strings t·w whose last token w starts with ``rest`` (module docstring).

    ``tokens`` is t (ids after the context), ``logp`` = log p(t), ``rest`` = u (``b""``: t
    ends at the prefix), ``logw`` = log W(t, u), ``row`` the LM's next-token log-probs after
    t (``(V,)``, fetched by :class:`~llamppl.lm.bytes.ByteLM`; None until then).
    """

    tokens: tuple[int, ...]
    logp: float
    rest: bytes
    logw: float
    row: torch.Tensor | None = None


@dataclass
class Covering:
    """The (possibly pruned) covering of one byte prefix, heaviest element first.

    ``logprob`` is log P(prefix) summed before pruning (a lower bound under a beam); ``masses``
    the ``(E, 258)`` log-mass table of :func:`element_masses` and ``dist`` the ``(257,)``
    next-byte log-probs, once computed.
    """

    prefix: bytes
    elements: list[Element]
    logprob: float
    masses: torch.Tensor | None = field(default=None, repr=False)
    dist: torch.Tensor | None = field(default=None, repr=False)

    def pending(self) -> list[Element]:
        """The elements whose next-token row is not fetched yet."""
        return [e for e in self.elements if e.row is None]


class ByteTables:
    """Per-LM tables of the byte view (built once per LM by :func:`byte_tables`).

    Attributes
    ----------
    token_bytes : list[bytes]
        ``lm.byte_vocab``.
    bins_host : list[int]
        A token's first byte (0..255), ``256`` for end tokens, ``257`` for tokens outside the
        byte view.
    sorted_bytes : list[bytes]
        The text tokens' bytes, sorted (tokens that start with u are one range of it).
    sorted_ids : torch.Tensor
        ``(T,)`` long on the LM's device: the ids in that order.
    by_bytes : dict[bytes, list[int]]
        The text token ids of each byte string.
    excluded : torch.Tensor
        ``(X,)`` long on the LM's device: the ids outside the byte view (not the end tokens).
    """

    def __init__(self, lm: LanguageModel) -> None:
        self.token_bytes = list(lm.byte_vocab)
        ends, excluded = set(lm.eos_token_ids), excluded_ids(lm)
        self.bins_host = [
            EOS_BYTE if i in ends else _EXCLUDED if i in excluded else b[0]
            for i, b in enumerate(self.token_bytes)
        ]
        text = sorted((b, i) for i, b in enumerate(self.token_bytes) if self.bins_host[i] < 256)
        self.sorted_bytes = [b for b, _ in text]
        self.device = lm.device
        self.sorted_ids = torch.tensor([i for _, i in text], dtype=torch.long, device=self.device)
        self.excluded = torch.tensor(
            [i for i, b in enumerate(self.bins_host) if b == _EXCLUDED],
            dtype=torch.long,
            device=self.device,
        )
        self.by_bytes: dict[bytes, list[int]] = {}
        for b, i in text:
            self.by_bytes.setdefault(b, []).append(i)
        self._longest = max((len(b) for b in self.sorted_bytes), default=0)
        self._root = (
            torch.arange(len(self.token_bytes), device=self.device),
            torch.tensor(self.bins_host, dtype=torch.long, device=self.device),
        )
        self._nodes: LRU[bytes, tuple[torch.Tensor, torch.Tensor]] = LRU(1 << 14)

    def node(self, rest: bytes) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids, bins)``: the tokens that strictly extend ``rest`` and the byte each has after
        it (``rest == b""``: every token, its first byte, the end and excluded bins)."""
        if not rest:
            return self._root
        found = self._nodes.get(rest)
        if found is None:
            lo = bisect.bisect_right(self.sorted_bytes, rest)  # after the token equal to rest
            hi = bisect.bisect_right(self.sorted_bytes, rest + b"\xff" * (self._longest + 1))
            d = len(rest)
            bins = torch.tensor(
                [b[d] for b in self.sorted_bytes[lo:hi]], dtype=torch.long, device=self.device
            )
            found = (self.sorted_ids[lo:hi], bins)
            self._nodes.put(rest, found)
        return found


def excluded_ids(lm: LanguageModel) -> set[int]:
    """Token ids outside the byte view: BOS, tokens of no bytes, and the tokenizer's special or
    added-special tokens (``<|im_start|>``); end tokens are the end outcome instead."""
    out = {i for i, b in enumerate(lm.byte_vocab) if not b}
    if lm.bos_token_id is not None:
        out.add(lm.bos_token_id)
    tokenizer = getattr(lm, "tokenizer", None)
    if tokenizer is not None:
        out |= set(getattr(tokenizer, "all_special_ids", []) or [])
        for i, added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
            if getattr(added, "special", False):
                out.add(int(i))
    return out - set(lm.eos_token_ids)


def byte_tables(lm: LanguageModel) -> ByteTables:
    """The :class:`ByteTables` of ``lm`` (computed once per LM)."""
    return lm_table(lm, "bytes.byte_tables", ByteTables)


def root_covering() -> Covering:
    """The covering of the empty prefix: the empty token string, probability 1."""
    return Covering(b"", [Element((), 0.0, b"", 0.0)], 0.0)


def element_masses(tables: ByteTables, cover: Covering) -> torch.Tensor:
    """``(E, 258)`` float64 log-masses under the byte view p̃ (module docstring): ``[e, b]`` =
    log Σ p̃(w | t_e) over the tokens w that strictly extend ``rest_e`` and have byte b after
    it, for an element with empty rest also the end tokens (bin 256); ``[e, 257]`` = log(1 −
    p(X | t_e)), the token LM's mass inside the byte view, by which the other bins were
    divided (``-inf``: all of it outside, and every bin ``-inf``). Every element's ``row``
    must be fetched. One ``index_add`` for all elements."""
    ids, bins, rows, outside = [], [], [], []
    for e, el in enumerate(cover.elements):
        node_ids, node_bins = tables.node(el.rest)
        row = el.row.to(torch.float64)
        keep = node_bins != _EXCLUDED
        rows.append(row[node_ids[keep]].exp())  # (n_e,)
        bins.append(node_bins[keep] + e * _BINS)
        ids.append(node_ids[keep])
        outside.append(
            row[tables.excluded].exp().sum() if tables.excluded.numel() else row.new_zeros(())
        )
    n = len(cover.elements)
    flat = torch.zeros(n * _BINS, dtype=torch.float64, device=tables.device)
    if rows:
        flat.index_add_(0, torch.cat(bins), torch.cat(rows))
    masses = flat.view(n, _BINS).log()
    if n:
        inside = torch.log1p(-torch.stack(outside).clamp(max=1.0))  # (E,) log(1 − p(X | t_e))
        masses[:, : EOS_BYTE + 1] -= inside[:, None]
        masses[inside == -math.inf, :] = -math.inf  # p̃ undefined: nothing inside the view
        masses[:, _EXCLUDED] = inside
    return masses


def next_byte_logprobs(cover: Covering) -> torch.Tensor:
    """``(257,)`` float64 next-byte log-probs from ``cover.masses`` (index 256: the end),
    P(b | σ) ∝ Σ_e p(t_e) M_{t_e}(rest_e·b), normalised over the 257 outcomes; all ``-inf``
    for an empty covering (an impossible prefix)."""
    if not cover.elements:
        return torch.full((257,), -math.inf, dtype=torch.float64)
    masses = cover.masses
    logp = torch.tensor([e.logp for e in cover.elements], dtype=masses.dtype, device=masses.device)
    total = torch.logsumexp(masses[:, :257] + logp[:, None], dim=0)  # (257,)
    out = total - torch.logsumexp(total, dim=0)
    return torch.where(torch.isnan(out), -math.inf, out)  # every outcome impossible


def extend_covering(tables: ByteTables, cover: Covering, byte: int, beam: int | None) -> Covering:
    """The covering of ``cover.prefix + bytes([byte])`` from that of the prefix (module
    docstring), pruned to the ``beam`` heaviest elements (``None``: exact, keep all).

    ``cover.masses`` must be computed. One host read for all new weights; the closures'
    rows are left to fetch.
    """
    els = cover.elements
    if not els:
        return Covering(cover.prefix + bytes([byte]), [], -math.inf)
    masses = cover.masses
    logp = torch.tensor([e.logp for e in els], dtype=masses.dtype, device=masses.device)
    weights = masses[:, byte] + logp  # (E,) log W(t_e, rest_e·byte)
    closing = []  # (index of the element, token id): rest·byte is a whole token
    for i, el in enumerate(els):
        for w in tables.by_bytes.get(el.rest + bytes([byte]), ()):
            closing.append((i, w))
    parts = [weights]
    if closing:  # log p̃(t_e) + log p̃(w | t_e) = log p(t_e) + log p(w | t_e) − log(1 − p(X | t_e))
        idx = torch.tensor([i for i, _ in closing], dtype=torch.long, device=masses.device)
        parts.append(
            torch.stack([els[i].row[w].to(torch.float64) for i, w in closing])
            + logp[idx]
            - masses[idx, _EXCLUDED]
        )
        parts[-1] = torch.nan_to_num(parts[-1], nan=-math.inf, posinf=-math.inf)  # p̃ undefined
    values = torch.cat(parts).tolist()  # one read
    logprob = _logsumexp(values[: len(els)])
    order = sorted((i for i in range(len(els)) if values[i] > -math.inf), key=lambda i: -values[i])
    kept = set(order if beam is None else order[:beam])
    new = [
        Element(els[i].tokens, els[i].logp, els[i].rest + bytes([byte]), values[i], els[i].row)
        for i in order
        if i in kept
    ]
    for (i, w), v in zip(closing, values[len(els) :]):
        if i in kept and v > -math.inf:  # part of a kept element's mass: kept with it
            new.append(Element(els[i].tokens + (w,), v, b"", v))
    return Covering(cover.prefix + bytes([byte]), new, logprob)


def _logsumexp(values: Sequence[float]) -> float:
    if not values:
        return -math.inf
    top = max(values)
    if top == -math.inf:
        return -math.inf
    return top + math.log(sum(math.exp(v - top) for v in values))
