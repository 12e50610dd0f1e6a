"""COLLIE constraint trees -> llamppl text-structure constraints (the benchmark's translator).

Each COLLIE-v1 instance carries its constraint as a JSON tree of ``collie.constraints``
classes (see ``../shared/data/collie/README.md``). :func:`translate` reads that tree and
its ``targets`` and builds the same constraint from the library's building blocks
(:mod:`llamppl.decoding.text.builders`), node by node:

=====================================================  =======================================
COLLIE node (input level, target level, transform)     llamppl constraint
=====================================================  =======================================
None, character, ``Count``                             ``char_count``
None, character, ``Position(i or [i...])``             ``chars_at``
None, word / sentence / paragraph, ``Count``           ``word_count`` / ``sentence_count`` /
                                                       ``paragraph_count``
None, word / sentence, ``Position``                    ``UnitsAt`` (``words_at``)
None, word, ``ForEach(...)`` with ``in`` / ``not in``  ``contains_words`` / ``excludes_words``
outer, inner, ``ForEach(Count())``, ``all``            ``EachCount`` (``words_per_sentence``...)
outer, inner, ``ForEach(Position(i))``, ``all``        ``EachAt`` (``first_word_of_sentences``...)
``All(...)``                                           ``&`` of the parts, targets zipped
=====================================================  =======================================

Two rewrites keep the result identical while giving the prefix check more to work with:
a negative position next to an exact count of the same units becomes the positive one
(``Position(-1)`` of a 10-character text is position 9), and "the last sentence of
paragraph ``i`` is ``s_i``" next to "every paragraph has at least ``m`` sentences" becomes
one ``last_sentence_of_paragraphs(s, min_sentences=m)``. Shapes COLLIE-v1 does not use
raise ``NotImplementedError``. The judge never sees these objects: grading is
``collie_judge.judge``.

Example::

    from collie_judge import load
    from collie_translate import translate
    inst = load()[0]
    c = translate(inst)            # char_count(at_least=15)
    c.accepts_end(inst["example"])  # True, as the judge says
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llamppl.decoding.constraints.protocol import AllOf, Constraint
from llamppl.decoding.text.builders import (
    Bounds,
    CharCount,
    CharsAt,
    EachAt,
    EachCount,
    UnitCount,
    UnitsAt,
    WordsExcluded,
    WordsIncluded,
)

__all__ = ["translate", "translate_tree"]

_BOUND = {"==": "exactly", ">=": "at_least", "<=": "at_most"}


def _level(node: Any) -> str | None:
    return None if node is None else node.get("level")


def _bounds(op: str, target: Any) -> Bounds:
    if isinstance(target, list) and len(target) == 1:  # COLLIE unwraps one-element targets
        target = target[0]
    if op not in _BOUND:
        raise NotImplementedError(f"count relation {op!r}")
    return Bounds(**{_BOUND[op]: target})


def _one(node: Mapping[str, Any], target: Any) -> Constraint:
    """One COLLIE ``Constraint`` node and its target."""
    outer, inner = _level(node.get("input_level")), _level(node.get("target_level"))
    transform, op = node["transformation"], node["relation"]["operand"]
    reduction = (node.get("reduction") or {}).get("reduction")
    kind = transform["class"]
    if outer is None and reduction is None:
        if kind == "Count" and transform.get("count_target") is None:
            b = _bounds(op, target)
            return CharCount(b) if inner == "character" else UnitCount(inner, b)
        if kind == "Position" and op == "==":
            where = transform["position"]
            if isinstance(where, list):
                if not isinstance(target, list) or len(target) != len(where) or len(where) < 2:
                    raise NotImplementedError("Position list and target list of other lengths")
                positions = dict(zip(where, target))
            else:
                positions = {where: target}
            return CharsAt(positions) if inner == "character" else UnitsAt(inner, positions)
        if kind == "ForEach" and transform["func"]["class"] == "Ellipsis" and inner == "word":
            words = target if isinstance(target, list) else [target]
            if op == "in":
                return WordsIncluded(words)
            if op == "not in":
                return WordsExcluded(words)
    if outer is not None and reduction == "all" and kind == "ForEach":
        func = transform["func"]
        if func["class"] == "Count" and func.get("count_target") is None:
            return EachCount(outer, inner, _bounds(op, target))
        if func["class"] == "Position" and op == "==" and isinstance(func["position"], int):
            return EachAt(outer, inner, func["position"], target)
    raise NotImplementedError(f"COLLIE constraint node not translated: {node}")


def _rewrite(parts: list[Constraint]) -> list[Constraint]:
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
            p = CharsAt({(i + n if i < 0 else i): c for i, c in _raw(p).items()})
        elif isinstance(p, UnitsAt) and exact.get(p.level) is not None:
            n = exact[p.level]
            p = UnitsAt(p.level, {(i + n if i < 0 else i): t for i, t in p.spelled.items()})
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
        merged = EachAt(e.outer, e.inner, e.index, list(e.spelled), min_inner=f.bounds.lo)
        out = [merged if p is e else p for p in out if p is not f]
    return out


def _raw(p: CharsAt) -> dict[int, str]:
    return dict(p.raw_positions)


def translate_tree(tree: Mapping[str, Any], targets: Any) -> Constraint:
    """The llamppl constraint equal to the COLLIE tree ``tree`` checked against ``targets``."""
    if tree["class"] == "All":
        if not isinstance(targets, list) or len(targets) != len(tree["callables"]):
            raise ValueError("All(...) needs one target per callable")
        parts = [_one(node, t) for node, t in zip(tree["callables"], targets)]
        parts = _rewrite(parts)
        return parts[0] if len(parts) == 1 else AllOf(*parts)
    if tree["class"] != "Constraint":
        raise NotImplementedError(f"COLLIE node {tree['class']!r}")
    return _one(tree, targets)


def translate(instance: Mapping[str, Any]) -> Constraint:
    """The llamppl constraint of one COLLIE instance (its ``constraint`` tree and ``targets``)."""
    if not isinstance(instance, Mapping) or "constraint" not in instance:
        raise TypeError("instance must be one COLLIE instance (with 'constraint' and 'targets')")
    return translate_tree(instance["constraint"], instance["targets"])
