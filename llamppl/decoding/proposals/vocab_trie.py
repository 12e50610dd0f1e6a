"""The vocabulary as a radix trie: which tokens a text's prefix check allows, proved with few checks.

A text constraint's prefix check answers "can s still be completed into an acceptable
string?" (the set C of the LLaMPPL paper, §2.2). Such a set is *closed under prefixes*:
every completion of s·x·y is a completion of s·x, so if s·x cannot be completed, neither
can s·x·y. One rejected check of s·x therefore rejects every token whose string starts
with x, unchecked.

:class:`VocabTrie` stores the token strings in a radix trie: an edge carries a string, and
there is a node wherever token strings branch or one ends. :meth:`VocabTrie.allowed`
checks s·x at each node x it reaches, from the root down, and descends only below the
nodes that pass; the tokens ending at a passing node are the allowed ones. Each node is
checked at most once and a radix trie has fewer inner nodes than leaves, so the walk never
makes more than about twice the checks of the token-by-token scan, and on a selective check
far fewer: proving that no token extends a partial SMILES string ending in ``…ccc324``
took 452 checks of ``partialsmiles`` instead of 49,152 on the embedded model's vocabulary,
and listing the 249 tokens allowed after ``BrC1=C2C3CC`` took 1,485.

The lazy proposal (:mod:`~llamppl.decoding.proposals.lazy`) calls it when a draw has
rejected many tokens in a row: a state that allows few tokens (or none, Z = 0) would
otherwise be scanned token by token over the whole vocabulary.

On a check closed under prefixes the listing is exactly the tokens the token-by-token scan
accepts. A check that is only *sound* (it rejects a text only when no completion passes,
but may accept a longer text it cannot yet decide: COLLIE's word checks reject ``praisit``
and accept ``praisité``) lists a subset that leaves out only such dead tokens, which keeps
the lazy draw's target exact (:mod:`~llamppl.decoding.proposals.lazy`, "Long runs of
rejections"). A check that may reject a text some completion of which passes (a predicate
that rejects ``"ab"`` but accepts ``"abc"`` as a good prefix) sets ``prefix_closed = False``
(:class:`~llamppl.decoding.constraints.protocol.Constraint`) and is only ever checked on whole tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from llamppl.lm.base import LanguageModel
from llamppl.lm.memo import lm_table

__all__ = ["VocabTrie", "TrieWalk", "vocab_trie"]


class _Node:
    __slots__ = ("edges", "ids")

    def __init__(self) -> None:
        self.edges: dict[str, _Node] = {}
        self.ids: list[int] = []


class VocabTrie:
    """A radix trie of token strings (the tokens ``skip`` names left out).

    ``nodes`` counts the non-root nodes: the most checks one :meth:`allowed` walk can make.
    ``order`` lists the token ids depth first, so that the tokens below any node are the
    slice ``order[lo:hi]`` of that node's range (:meth:`live`).
    """

    def __init__(self, vocab: Sequence[str], skip: Sequence[int] = ()) -> None:
        left_out = set(skip)
        root = _Node()
        for i, text in enumerate(vocab):
            if i in left_out:
                continue
            node = root
            for ch in text:
                node = node.edges.setdefault(ch, _Node())
            node.ids.append(i)
        self.root_ids = tuple(root.ids)  # tokens whose string is empty
        self.order: list[int] = list(root.ids)
        self.nodes = 0
        # the compressed form: (label, ids, children, lo, hi) with chains of one child merged
        self.children = [self._compress(label, child) for label, child in root.edges.items()]

    def _compress(self, label: str, node: _Node) -> tuple:
        while not node.ids and len(node.edges) == 1:  # a chain: merge it into the edge
            ((ch, node),) = node.edges.items()
            label += ch
        self.nodes += 1
        lo = len(self.order)
        self.order.extend(node.ids)
        kids = [self._compress(ch, child) for ch, child in node.edges.items()]
        return (label, tuple(node.ids), kids, lo, len(self.order))

    def live(self, finite: torch.Tensor) -> Callable[[int, int], bool]:
        """``live(lo, hi)``: whether a node's range holds a token that ``finite`` (``(V,)``
        bool, e.g. the tokens of positive probability after a cheap mask) marks. One
        cumulative sum over the depth-first order on ``finite``'s device and one host read."""
        index = torch.tensor(self.order, dtype=torch.long, device=finite.device)
        counts = [0, *torch.cumsum(finite[index].to(torch.int32), 0).tolist()]
        return lambda lo, hi: counts[hi] > counts[lo]

    def allowed(
        self,
        check: Callable[[str], bool],
        budget: int | None = None,
        live: Callable[[int, int], bool] | None = None,
    ) -> tuple[list[int] | None, int]:
        """``(ids, checks)``: the tokens ``w`` with ``check(vocab[w])`` true, found by checking
        only the trie's nodes below passing ones (module docstring), and the checks made.

        ``check(x)`` answers for the constraint's text followed by ``x`` and must be closed
        under prefixes. With ``budget``, the walk stops after that many checks and returns
        ``(None, budget)`` (:class:`TrieWalk` resumes a walk instead). With ``live``
        (:meth:`live`), a node with no live token below is skipped unchecked, its tokens
        unlisted (the walk may still list dead tokens of a live node).
        """
        walk = TrieWalk(self, check, live)
        return walk.run(budget), walk.checks


class TrieWalk:
    """A walk of a :class:`VocabTrie` with one check, in steps: :meth:`run` continues where
    the last call stopped, so a walk cut by a budget loses none of its checks. With ``live``
    (:meth:`VocabTrie.live`) it neither checks nor lists what has no live token below."""

    def __init__(
        self,
        trie: VocabTrie,
        check: Callable[[str], bool],
        live: Callable[[int, int], bool] | None = None,
    ) -> None:
        self.check, self.checks, self.ids, self.live = check, 0, [], live
        # (text of the node, tokens ending there, its children, its range); the root's text is ""
        roots = len(trie.root_ids)
        self.pending = [("", trie.root_ids, trie.children, 0, roots)] if roots else []
        self.pending += [(label, *rest) for label, *rest in trie.children]
        self.root = trie.children

    def run(self, budget: int | None = None) -> list[int] | None:
        """Check at most ``budget`` more nodes (None: no bound); the allowed tokens once the
        walk is complete, else None."""
        spent, live = 0, self.live
        while self.pending:
            if budget is not None and spent >= budget:
                return None
            text, ids, kids, lo, hi = self.pending.pop()
            if live is not None and not live(lo, hi):
                continue  # no token below may be drawn
            spent += 1
            self.checks += 1
            if not self.check(text):
                continue  # every token below starts with a rejected text
            self.ids.extend(ids)
            if kids is not self.root:  # the root's children are queued already
                self.pending.extend((text + label, *rest) for label, *rest in kids)
        return self.ids


def vocab_trie(lm: LanguageModel, skip: Sequence[int] = ()) -> VocabTrie:
    """The radix trie of ``lm``'s vocabulary without the tokens ``skip`` (the end tokens),
    built once per LM and ``skip``."""
    key = tuple(sorted(skip))
    return lm_table(lm, ("vocab_trie", key), lambda lm: VocabTrie(lm.vocab, key))
