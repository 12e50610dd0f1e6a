"""The last tiers of JSON Schema compilation: a superset grammar llguidance accepts, and what was dropped.

When even llguidance's relaxed compiler refuses a schema, :func:`strip_unsupported` removes
the keywords it cannot express — each removal only *enlarges* the set of accepted JSON
texts, so the grammar's language is a superset of the valid texts and the final
``jsonschema`` check (the complete check of :class:`~llamppl.decoding.grammar.compile.Grammar`)
restores the exact target:

- a ``pattern`` whose regular expression llguidance cannot parse (lookarounds,
  backreferences, syntax of other engines): dropped from the grammar, kept as a prefix check
  on the strings it applies to (:class:`~llamppl.decoding.grammar.json_patterns.JSONStringPatterns`,
  with the ``regex`` package, which has lookarounds and backreferences);
- ``patternProperties`` with such a regex: dropped, together with the object's
  ``additionalProperties`` (any further key and value is then allowed);
- the sibling keywords of a ``$ref`` (llguidance refuses them on circular references):
  dropped, the ``$ref`` kept.

The instances a schema holds (``const``, ``enum``, ``default``, ``examples``) are data and
are never stripped; a ``pattern`` or ``$ref`` counts only with a string value (a property
named ``$ref`` is not a reference). A keyword missed that way (a property named
``enum``) only leaves a pattern in place: the compile then falls to the next tier.

:func:`skeleton` is the tier after that: only the schema's top-level ``type``, for schemas
too large for the engine. :func:`is_refusal` tells the errors that no superset can cure: an
unsatisfiable schema, or a reference that does not resolve::

    stripped, dropped = strip_unsupported(schema, regex_ok)
    dropped      # [(("password",), "^(?=.*\\d).{8,}$"), ...]: (JSON path, pattern) pairs

**Where a dropped pattern is a prefix check.** Only where it applies *unconditionally* to
every string at its path: a pattern reached from the root through nothing but ``$ref``,
``allOf``, a one-branch ``anyOf`` / ``oneOf``, ``properties``, ``additionalProperties``,
``items``, ``prefixItems`` and ``additionalItems``, read as the ``jsonschema`` validator
of the schema's draft reads them (the one :class:`~llamppl.decoding.grammar.json_check.SchemaCheck`
uses). A pattern under ``anyOf`` / ``oneOf`` branches, ``if`` / ``then`` / ``else``,
``not``, ``patternProperties``, ``dependentSchemas`` / ``dependencies``, ``contains``,
``propertyNames``, ``unevaluated*``, ``$dynamicRef`` / ``$recursiveRef``, a reference into
another resource (``$id``, an anchor, another document) or a subschema with its own
``$schema`` is left to the final check alone: still exact, with less guidance. A path step
is a property name (``str``), an array position (``int``), :class:`AnyKey` (the keys
``additionalProperties`` covers: every key but the sibling ``properties``; not collected
next to ``patternProperties``) or :class:`AnyIndex` (the positions ``items`` or
``additionalItems`` cover: from the end of ``prefixItems`` / an ``items`` array on).
Drafts 3 to 7 ignore the siblings of a ``$ref``, and so does the walk there; Draft 2020-12
reads ``prefixItems`` and ``items``, the drafts before it ``items`` arrays and
``additionalItems``.

Every occurrence of a duplicated key is checked, as the grammar checks every occurrence
against the schema in the other tiers (``json.loads`` keeps the last one).

Collecting the pairs is linear in the schema: a pattern reached through ``$ref`` gets the
path of each use, but each definition is walked once (once per hop budget if it is
recursive) and its pairs reused at every use; a recursive definition is unrolled
:data:`_MAX_DEPTH` references deep, and listing the pairs stops at :data:`_MAX_RULES` pairs
or :data:`_MAX_STEPS` steps. These limits only leave prefix checks out, which the final
check still makes; no path is widened to save work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import unquote

__all__ = [
    "AnyIndex",
    "AnyKey",
    "Step",
    "is_refusal",
    "rule_matches",
    "skeleton",
    "strip_unsupported",
]


@dataclass(frozen=True)
class AnyKey:
    """A path step: any object key but those in ``excluding`` (the keys an object's
    ``additionalProperties`` covers: all but its sibling ``properties``)."""

    excluding: frozenset[str] = frozenset()

    def matches(self, element: str | int) -> bool:
        """Whether the step covers ``element`` of a value's path (a key, or an index)."""
        return isinstance(element, str) and element not in self.excluding


@dataclass(frozen=True)
class AnyIndex:
    """A path step: any array position from ``start`` on (what ``items`` covers after
    ``prefixItems``, or ``additionalItems`` after an ``items`` array)."""

    start: int = 0

    def matches(self, element: str | int) -> bool:
        """Whether the step covers ``element`` of a value's path (a key, or an index)."""
        return isinstance(element, int) and element >= self.start


#: One step of a rule's path: this key, this array position, or a set of either.
Step = str | int | AnyKey | AnyIndex


def rule_matches(rule: Sequence[Step], path: Sequence[str | int]) -> bool:
    """Whether a value at ``path`` (keys and array positions from the root, as
    :func:`~llamppl.decoding.grammar.json_patterns.string_values` reports them) is under ``rule``."""
    if len(rule) != len(path):
        return False
    for step, element in zip(rule, path):
        if isinstance(step, (AnyKey, AnyIndex)):
            if not step.matches(element):
                return False
        elif type(step) is not type(element) or step != element:  # "0" is a key, 0 a position
            return False
    return True


_REF_KEEP = {"$ref", "$defs", "definitions", "$id", "$schema", "$anchor", "title", "description"}
# Keywords whose values are JSON instances, not schemas: never stripped (a "pattern" key in
# a const object is data; removing it would change which texts are valid)
_VALUES = {"const", "enum", "default", "examples"}
_REFUSALS = ("unsatisfiable", "does not exist", "unresolvable", "unknown reference", "not found")
_MAX_DEPTH = 12  # $ref hops followed on one path when collecting dropped patterns' paths
_MAX_RULES = 256  # dropped (path, pattern) pairs reported at most
_MAX_STEPS = 1 << 16  # steps spent listing them (repeated paths through shared definitions)


def is_refusal(error: str | None) -> bool:
    """Whether llguidance's ``error`` says the schema has no valid instance or an unresolvable
    reference (then it is refused, not relaxed)."""
    text = (error or "").lower()
    return any(word in text for word in _REFUSALS)


def strip_unsupported(
    schema: Any, regex_ok: Callable[[str], bool], draft: str | None = None
) -> tuple[Any, list[tuple[tuple[Step, ...], str]]]:
    """``schema`` without the keywords above, and the dropped ``(path, pattern)`` pairs.

    ``regex_ok(pattern)`` says whether the grammar engine parses a pattern (asked once per
    distinct pattern). Pairs are listed only where the pattern applies unconditionally to
    every string at the path (module docstring), as the ``jsonschema`` validator class
    named ``draft`` reads the schema (``"Draft7Validator"``, …; None: the class
    ``jsonschema`` picks for it, Draft 2020-12 when it names none; a class not known here:
    no pairs); patterns reached through ``$ref`` get the path of where the reference is
    used. Paths follow at most :data:`_MAX_DEPTH` references each (a recursive definition
    is unrolled that far, no further) and at most :data:`_MAX_RULES` pairs are reported,
    the first in document order (found in at most :data:`_MAX_STEPS` steps): the limits
    only leave checks out, which the final ``jsonschema`` check still makes, and never
    widen one. The work is linear in the schema (:class:`_DroppedPatterns`).
    """
    known: dict[str, bool] = {}

    def ok(pattern: str) -> bool:
        if pattern not in known:
            known[pattern] = bool(regex_ok(pattern))
        return known[pattern]

    def strip(node: Any) -> Any:
        if isinstance(node, list):
            return [strip(x) for x in node]
        if not isinstance(node, dict):
            return node
        out = {k: v if k in _VALUES else strip(v) for k, v in node.items()}
        if isinstance(out.get("pattern"), str) and not ok(out["pattern"]):
            del out["pattern"]
        props = out.get("patternProperties")
        if isinstance(props, dict) and not all(ok(k) for k in props):
            del out["patternProperties"]
            out.pop("additionalProperties", None)
        if isinstance(out.get("$ref"), str):
            out = {k: v for k, v in out.items() if k in _REF_KEEP}
        return out

    root = schema if isinstance(schema, dict) else {}
    dialect = dialect_of(draft if draft is not None else draft_of(root))
    found = _DroppedPatterns(root, ok, dialect).visit(root, _MAX_DEPTH) if dialect else _NOTHING
    return strip(schema), _pairs(found)


class _Dialect(NamedTuple):
    """How a draft's validator reads the keywords the walk follows.

    Attributes
    ----------
    ref_alone : bool
        A ``$ref`` hides its sibling keywords (drafts 3 to 7).
    prefix_items : bool
        ``prefixItems`` then ``items`` (Draft 2020-12); else an ``items`` array then
        ``additionalItems``.
    id_key : str
        The keyword that starts a new resource (a new base for ``#`` references).
    """

    ref_alone: bool
    prefix_items: bool
    id_key: str


_DIALECTS = {
    "Draft3Validator": _Dialect(True, False, "id"),
    "Draft4Validator": _Dialect(True, False, "id"),
    "Draft6Validator": _Dialect(True, False, "$id"),
    "Draft7Validator": _Dialect(True, False, "$id"),
    "Draft201909Validator": _Dialect(False, False, "$id"),
    "Draft202012Validator": _Dialect(False, True, "$id"),
}


def dialect_of(draft: str) -> _Dialect | None:
    """The reading of the validator class named ``draft`` (None: not one known here)."""
    return _DIALECTS.get(draft)


def draft_of(schema: dict) -> str:
    """The name of the validator class ``jsonschema`` picks for ``schema`` (as
    :class:`~llamppl.decoding.grammar.json_check.SchemaCheck` does); "" without ``jsonschema``."""
    try:
        import jsonschema
        from jsonschema.validators import validator_for
    except ImportError:  # pragma: no cover - the final check needs jsonschema anyway
        return ""
    return validator_for(schema, default=jsonschema.Draft202012Validator).__name__


class _Found(NamedTuple):
    """What the walk found below one node, relative to it: the dropped patterns (as a
    shared structure, listed by :func:`_pairs`) and how far the walk went.

    Attributes
    ----------
    parts : tuple[tuple[tuple[Step, ...], str | _Found], ...]
        In document order, ``(path step, part)``: a part is a pattern dropped at the
        step, or what was found below a child (never an empty one). Children reached
        from several places are shared, not copied.
    height : int
        The most ``$ref`` hops the walk followed on one path.
    cut : bool
        Whether the walk met a reference it had no hops left for (then ``parts`` holds
        for this hop budget only).
    """

    parts: tuple[tuple[tuple[Step, ...], str | _Found], ...] = ()
    height: int = 0
    cut: bool = False


_NOTHING = _Found()
_CUT = _Found(cut=True)


class _DroppedPatterns:
    """The dropped patterns below a schema's nodes that apply unconditionally, each ``$ref``
    target walked once.

    :meth:`visit` returns what a node holds, relative to it; a ``$ref`` contributes its
    target's, computed once per target and hop budget (:meth:`follow`) and shared by
    every use. A target whose walk never ran out of hops is reused for every budget at
    least as large, so a schema without recursive references walks each node about once
    and a recursive one at most ``_MAX_DEPTH + 1`` times. Nothing is copied per path:
    :func:`_pairs` lists the paths afterwards, the first :data:`_MAX_RULES` only.
    """

    def __init__(self, root: dict, regex_ok: Callable[[str], bool], dialect: _Dialect) -> None:
        self.root, self.regex_ok, self.dialect = root, regex_ok, dialect
        self.by_budget: dict[tuple[int, int], _Found] = {}  # (id(target), hops) -> found
        self.uncut: dict[int, _Found] = {}  # id(target) -> a walk no hop budget cut

    def visit(self, node: Any, hops: int) -> _Found:
        """What ``node`` holds with ``hops`` more ``$ref``s allowed on each path."""
        if not isinstance(node, dict) or (node is not self.root and self.elsewhere(node)):
            return _NOTHING
        children: list[tuple[tuple[Step, ...], _Found]] = []
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            children.append(((), self.follow(ref, hops)))
        pattern = node.get("pattern")
        if "$ref" in node and self.dialect.ref_alone:  # the siblings are not read at all
            pattern = None
        else:
            children += [((), self.visit(sub, hops)) for sub in _conjuncts(node)]
            children += [((step,), self.visit(sub, hops)) for step, sub in _applied(node)]
            children += [((step,), self.visit(sub, hops)) for step, sub in self.items(node)]
        parts: list[tuple[tuple[Step, ...], str | _Found]] = []
        if isinstance(pattern, str) and not self.regex_ok(pattern):
            parts.append(((), pattern))
        parts += [(step, found) for step, found in children if found.parts]
        height = max((found.height for _, found in children), default=0)
        return _Found(tuple(parts), height, any(found.cut for _, found in children))

    def elsewhere(self, node: dict) -> bool:
        """Whether ``node`` starts another resource (its own base for references) or reads
        as another draft (its own ``$schema``): the walk does not enter it."""
        return "$schema" in node or isinstance(node.get(self.dialect.id_key), str)

    def items(self, node: dict) -> list[tuple[Step, Any]]:
        """The array keywords of ``node`` with the positions each one covers."""
        items, out = node.get("items"), []
        if self.dialect.prefix_items:
            prefix = node.get("prefixItems")
            if isinstance(prefix, list):
                out += [(i, sub) for i, sub in enumerate(prefix)]
            if isinstance(items, dict) and ("prefixItems" not in node or isinstance(prefix, list)):
                out.append((AnyIndex(len(prefix or ())), items))
        elif isinstance(items, dict):
            out.append((AnyIndex(0), items))
        elif isinstance(items, list):
            out += [(i, sub) for i, sub in enumerate(items)]
            if isinstance(node.get("additionalItems"), dict):  # read only after an array
                out.append((AnyIndex(len(items)), node["additionalItems"]))
        return out

    def follow(self, ref: str, hops: int) -> _Found:
        """What the target of ``ref`` holds, with ``hops`` hops left before following it."""
        if hops <= 0:
            return _CUT
        target = resolve_pointer(self.root, ref, self.dialect.id_key)
        if not isinstance(target, dict):
            return _NOTHING
        whole = self.uncut.get(id(target))
        if whole is not None and hops >= whole.height:
            return whole
        key = (id(target), hops)
        if key not in self.by_budget:
            found = self.visit(target, hops - 1)
            found = _Found(found.parts, found.height + 1, found.cut)  # counting this hop
            self.by_budget[key] = found
            if not found.cut:
                self.uncut[id(target)] = found
        return self.by_budget[key]


def _applied(node: dict) -> list[tuple[Step, Any]]:
    """The object keywords of ``node`` with the keys each one covers: every ``properties``
    entry, and ``additionalProperties`` on the other keys unless ``patternProperties``
    (whose regexes would decide which) is beside it."""
    props, out = node.get("properties", {}), []
    if not isinstance(props, dict):
        return out
    out += [(name, sub) for name, sub in props.items()]
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and node.get("patternProperties", {}) == {}:
        out.append((AnyKey(frozenset(props)), extra))
    return out


def _conjuncts(node: dict) -> list[Any]:
    """The subschemas every instance of ``node`` must satisfy: ``allOf``'s, and the only
    branch of a one-branch ``anyOf`` or ``oneOf``."""
    out = list(node["allOf"]) if isinstance(node.get("allOf"), list) else []
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list) and len(node[key]) == 1:
            out.append(node[key][0])
    return out


def _pairs(found: _Found) -> list[tuple[tuple[Step, ...], str]]:
    """The ``(path, pattern)`` pairs of ``found``: unique, in document order, the first
    :data:`_MAX_RULES`, listed in at most :data:`_MAX_STEPS` steps (paths that repeat
    through shared definitions cost steps too)."""
    pairs: dict[tuple[tuple[Step, ...], str], None] = {}
    stack: list[tuple[tuple[Step, ...], str | _Found]] = [((), found)]
    steps = 0
    while stack and len(pairs) < _MAX_RULES and steps < _MAX_STEPS:
        path, part = stack.pop()
        if isinstance(part, str):
            pairs.setdefault((path, part))
        else:
            stack += [(path + step, sub) for step, sub in reversed(part.parts)]
        steps += 1 + (0 if isinstance(part, str) else len(part.parts))
    return list(pairs)


def resolve_pointer(root: dict, ref: str, id_key: str = "$id") -> Any:
    """The node a local ``#`` / ``#/...`` JSON pointer names, read as ``referencing`` reads
    it (percent-decoded, then ``~1`` and ``~0``); None when it does not resolve, names an
    anchor, or passes into a node with its own ``id_key`` (another resource's base)."""
    fragment = ref[1:] if ref.startswith("#") else None
    if fragment is None or (fragment and not fragment.startswith("/")):
        return None
    node: Any = root
    for part in unquote(fragment[1:]).split("/") if fragment else []:
        if isinstance(node, dict):
            part = part.replace("~1", "/").replace("~0", "~")
            if part not in node:
                return None
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
        if isinstance(node, dict) and isinstance(node.get(id_key), str):
            return None
    return node


def skeleton(schema: Any) -> dict:
    """Only the top-level ``type`` of ``schema`` (any JSON value when it names none)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    return {"type": kind} if isinstance(kind, (str, list)) else {}
