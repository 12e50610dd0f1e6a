"""COLLIE constraint trees as llamppl text constraints: :func:`from_collie`, :func:`collie_constraint`.

COLLIE (Yao et al., 2023) ships each instance's constraint as a tree of ``collie.constraints``
objects; COLLIE-v1's JSON form (``{"class": NAME, ...attributes}`` per node, as in the
shared ``collie_v1.json``) is read here node by node into the builders' constraints
(:mod:`~llamppl.decoding.text.builders`), with the instance's ``targets``:

=====================================================  =======================================
COLLIE node (input level, target level, transform)     llamppl constraint
=====================================================  =======================================
None, character, ``Count``                             ``char_count``
None, character, ``Position(i or [i...])``             ``chars_at``
None, word / sentence / paragraph, ``Count``           ``word_count`` / ``sentence_count`` /
                                                       ``paragraph_count``
None, word / sentence, ``Position``                    ``words_at`` (``UnitsAt``)
None, word, ``ForEach(...)`` with ``in`` / ``not in``  ``contains_words`` / ``excludes_words``
outer, inner, ``ForEach(Count())``, ``all``            ``EachCount`` (``words_per_sentence``...)
outer, inner, ``ForEach(Position(i))``, ``all``        ``EachAt`` (``first_word_of_sentences``...)
``All(...)``                                           ``&`` of the parts, targets zipped
=====================================================  =======================================

Two rewrites keep the constraint identical while giving the prefix check and the guides
more to work with: a negative position next to an exact count of the same units becomes the
positive one (``Position(-1)`` of a 10-character text is position 9), and "the last sentence
of paragraph ``i`` is ``s_i``" next to "every paragraph has at least ``m`` sentences" becomes
one ``last_sentence_of_paragraphs(s, min_sentences=m)``. Shapes COLLIE-v1 does not use raise
``NotImplementedError``. With ``plain=True`` (the default, as for the builders) the result
also keeps to plain characters (:mod:`~llamppl.decoding.text.plain`); ``plain=False`` gives
the judge's constraint alone, whose complete check is COLLIE's verdict (tested on every
reference text of COLLIE-v1's shared half). Nothing here grades: COLLIE's own checker does.

Example::

    import json
    from llamppl.constraints import collie_constraint
    inst = json.load(open("collie_v1.json"))["instances"][0]
    c = collie_constraint(inst, plain=False)   # char_count(at_least=15, plain=False)
    c.accepts_end(inst["example"])              # True, as the judge says
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llamppl.decoding.constraints.protocol import AllOf, Constraint
from llamppl.decoding.text.base import Bounds, plain_flag, with_implied
from llamppl.decoding.text.counts import CharCount, CharsAt, EachCount, UnitCount
from llamppl.decoding.text.positions import EachAt, UnitsAt
from llamppl.decoding.text.presence import WordsExcluded, WordsIncluded

__all__ = ["from_collie", "collie_constraint"]

RELATIONS = {"==": "exactly", ">=": "at_least", "<=": "at_most"}


def level_of(node: Any) -> str | None:
    """The level named by an ``InputLevel`` / ``TargetLevel`` node (None: no node)."""
    return None if node is None else node.get("level")


def bounds_of(op: str, target: Any) -> Bounds:
    """COLLIE's count relation and target as :class:`~llamppl.decoding.text.base.Bounds`."""
    if isinstance(target, list) and len(target) == 1:  # COLLIE unwraps one-element targets
        target = target[0]
    if op not in RELATIONS:
        raise NotImplementedError(f"count relation {op!r}")
    return Bounds(**{RELATIONS[op]: target})


def one_node(node: Mapping[str, Any], target: Any, plain: bool) -> Constraint:
    """One COLLIE ``Constraint`` node and its target, as one text constraint."""
    outer, inner = level_of(node.get("input_level")), level_of(node.get("target_level"))
    transform, op = node["transformation"], node["relation"]["operand"]
    reduction = (node.get("reduction") or {}).get("reduction")
    kind = transform["class"]
    if outer is None and reduction is None:
        if kind == "Count" and transform.get("count_target") is None:
            b = bounds_of(op, target)
            return (
                CharCount(b, plain=plain)
                if inner == "character"
                else UnitCount(inner, b, plain=plain)
            )
        if kind == "Position" and op == "==":
            where = transform["position"]
            if isinstance(where, list):
                if not isinstance(target, list) or len(target) != len(where) or len(where) < 2:
                    raise NotImplementedError("Position list and target list of other lengths")
                positions = dict(zip(where, target))
            else:
                positions = {where: target}
            if inner == "character":
                return CharsAt(positions, plain=plain)
            return UnitsAt(inner, positions, plain=plain)
        if kind == "ForEach" and transform["func"]["class"] == "Ellipsis" and inner == "word":
            words = target if isinstance(target, list) else [target]
            if op == "in":
                return WordsIncluded(words, plain=plain)
            if op == "not in":
                return WordsExcluded(words, plain=plain)
    if outer is not None and reduction == "all" and kind == "ForEach":
        func = transform["func"]
        if func["class"] == "Count" and func.get("count_target") is None:
            return EachCount(outer, inner, bounds_of(op, target), plain=plain)
        if func["class"] == "Position" and op == "==" and isinstance(func["position"], int):
            return EachAt(outer, inner, func["position"], target, plain=plain)
    raise NotImplementedError(f"COLLIE constraint node not translated: {node}")


def rewrite(parts: list[Constraint]) -> list[Constraint]:
    """The two exact rewrites of the module docstring."""
    exact = {
        ("character" if isinstance(p, CharCount) else p.level): p.bounds.lo
        for p in parts
        if isinstance(p, (CharCount, UnitCount)) and p.bounds.lo == p.bounds.hi
    }
    out: list[Constraint] = []
    for p in parts:
        if isinstance(p, CharsAt) and exact.get("character") is not None:
            n = exact["character"]
            moved = {(i + n if i < 0 else i): c for i, c in p.raw_positions.items()}
            p = CharsAt(moved, plain=p.plain)
        elif isinstance(p, UnitsAt) and exact.get(p.level) is not None:
            n = exact[p.level]
            moved = {(i + n if i < 0 else i): t for i, t in p.spelled.items()}
            p = UnitsAt(p.level, moved, plain=p.plain)
        out.append(p)
    ends = [p for p in out if isinstance(p, EachAt) and p.outer == "paragraph"]
    floors = [
        p
        for p in out
        if isinstance(p, EachCount)
        and (p.outer, p.inner) == ("paragraph", "sentence")
        and p.bounds.hi is None
    ]
    if len(ends) == 1 and len(floors) == 1 and not isinstance(ends[0].targets, str):
        e, f = ends[0], floors[0]
        merged = EachAt(
            e.outer, e.inner, e.index, list(e.spelled), min_inner=f.bounds.lo, plain=e.plain
        )
        out = [merged if p is e else p for p in out if p is not f]
    return out


def from_collie(tree: Mapping[str, Any], targets: Any, *, plain: bool = True) -> Constraint:
    """The text constraint of a COLLIE constraint tree (JSON form) checked against ``targets``.

    Parameters
    ----------
    tree
        The tree: ``{"class": "All", "callables": [...]}`` or one ``{"class": "Constraint",
        ...}`` node (COLLIE-v1's shapes; module docstring).
    targets
        The instance's targets (one per callable of an ``All``).
    plain
        Keep the text to plain characters too (default True, as the builders do).

    Raises
    ------
    TypeError
        If ``tree`` is not a mapping with a ``class``.
    ValueError
        If an ``All`` tree and its targets differ in length.
    NotImplementedError
        For a node shape COLLIE-v1 does not use.
    """
    if not isinstance(tree, Mapping) or "class" not in tree:
        raise TypeError(
            f"tree must be a COLLIE constraint tree (a mapping with 'class'), got {tree!r}"
        )
    plain = plain_flag(plain)
    if tree["class"] == "All":
        if not isinstance(targets, list) or len(targets) != len(tree["callables"]):
            raise ValueError("targets must hold one target per callable of All(...)")
        parts = rewrite([one_node(node, t, plain) for node, t in zip(tree["callables"], targets)])
        return with_implied(parts[0]) if len(parts) == 1 else AllOf(*parts)
    if tree["class"] != "Constraint":
        raise NotImplementedError(f"COLLIE node {tree['class']!r}")
    return with_implied(one_node(tree, targets, plain))


def collie_constraint(instance: Mapping[str, Any], *, plain: bool = True) -> Constraint:
    """The text constraint of one COLLIE instance (its ``constraint`` tree and ``targets``;
    :func:`from_collie`)."""
    if (
        not isinstance(instance, Mapping)
        or "constraint" not in instance
        or "targets" not in instance
    ):
        raise TypeError(
            "instance must be one COLLIE instance (a mapping with 'constraint' and 'targets')"
        )
    return from_collie(instance["constraint"], instance["targets"], plain=plain)
