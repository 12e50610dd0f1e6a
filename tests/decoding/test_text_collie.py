"""COLLIE trees as library constraints (``llamppl.decoding.text.collie``) and the token budget.

The complete check of every COLLIE-v1 instance's translation agrees with the judge on its
reference text in ``test_text_structure.py``; here: the rewrites, the spelling kept for
hints, plain characters by default, bad input named, and ``token_budget``; and that the guide
(``docs/programs/collie.md``) names every keyword of every builder.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import pytest

pytest.importorskip("nltk")

from text_programs import COLLIE_DATA, collie_instances  # noqa: E402

from llamppl import FunctionLM  # noqa: E402
from llamppl.constraints import (  # noqa: E402
    PlainCharacters,
    collie_constraint,
    contains_words,
    from_collie,
    token_budget,
    word_count,
)
from llamppl.decoding.constraints.protocol import AllOf  # noqa: E402
from llamppl.decoding.text.builders import CharsAt, EachAt, UnitsAt  # noqa: E402
from llamppl.decoding.text.token_budget import TOKENS_PER_WORD, WORDS_PER_SENTENCE  # noqa: E402

needs_data = pytest.mark.skipif(
    not COLLIE_DATA.is_file(), reason=f"no COLLIE data at {COLLIE_DATA}"
)
VOCAB = ["Pre", "-", "Pal", " jaw", ".", "\n", "(", "'s", " 'x", ",", " ,", "<eos>"]
LM = FunctionLM(VOCAB, len(VOCAB) - 1, lambda ctx: [math.sin(i + len(ctx)) for i in range(12)])


def _parts(c):
    return c.given if isinstance(c, AllOf) else (c,)


@needs_data
def test_translation_keeps_the_targets_spelling_for_hints():
    """The rewrites rebuild position constraints from the targets as given (hints write
    ``Pre-Palaeolithic``, not its lower-cased key)."""
    instances = {(inst["key"], inst["index"]): inst for inst in collie_instances()}
    c05 = collie_constraint(instances["guten_c05", 46])
    (at,) = [p for p in _parts(c05) if isinstance(p, UnitsAt)]
    assert at.spelled == {3: "jaw", 7: "Pre-Palaeolithic", 10: "II"}
    c14 = next(collie_constraint(i) for i in instances.values() if i["structure"] == "c14")
    ends = [p for p in _parts(c14) if isinstance(p, EachAt)]
    assert ends and all(any(ch.isupper() for ch in "".join(e.spelled)) for e in ends)


@needs_data
def test_a_position_from_the_end_next_to_an_exact_count_is_read_from_the_start():
    c03 = next(i for i in collie_instances() if i["structure"] == "c03")
    n, last = c03["targets"]
    (at,) = [p for p in _parts(collie_constraint(c03)) if isinstance(p, CharsAt)]
    assert at.raw_positions == {n - 1: last}


@needs_data
def test_plain_characters_by_default_one_part_from_all_targets():
    for inst in collie_instances()[::40]:
        judge_only = collie_constraint(inst, plain=False)
        plain = collie_constraint(inst)
        assert [repr(p) for p in _parts(plain)] == [
            repr(p).replace(", plain=False", "") for p in _parts(judge_only)
        ]
        found = [p for p in plain.parts if isinstance(p, PlainCharacters)]
        assert len(found) == 1
        assert not any(isinstance(p, PlainCharacters) for p in getattr(judge_only, "parts", ()))
        strings = [t for t in _flat(inst["targets"]) if isinstance(t, str)]
        assert set("".join(strings)) <= found[0].chars
        if plain.accepts_end(inst["example"]):  # plain characters only ever refuse more
            assert judge_only.accepts_end(inst["example"])


def _flat(targets):
    if isinstance(targets, list):
        return [x for t in targets for x in _flat(t)]
    return [targets]


def test_bad_trees_are_named():
    with pytest.raises(TypeError, match="tree"):
        from_collie(["not", "a", "tree"], [])
    with pytest.raises(TypeError, match="instance"):
        collie_constraint({"targets": []})
    node = {
        "class": "Constraint",
        "input_level": {"class": "InputLevel", "level": None},
        "target_level": {"class": "TargetLevel", "level": "word"},
        "transformation": {"class": "Count", "count_target": None},
        "relation": {"class": "Relation", "operand": "=="},
        "reduction": {"class": "Reduction", "reduction": None, "value": None},
    }
    assert repr(from_collie(node, 3, plain=False)) == "word_count(exactly=3, plain=False)"
    with pytest.raises(ValueError, match="one target per callable"):
        from_collie({"class": "All", "callables": [node, node]}, [3])
    with pytest.raises(NotImplementedError, match="count relation"):
        from_collie({**node, "relation": {"class": "Relation", "operand": "!="}}, 3)
    with pytest.raises(NotImplementedError, match="'Any'"):
        from_collie({"class": "Any"}, 3)
    with pytest.raises(TypeError, match="plain"):
        from_collie(node, 3, plain=None)


# ---------------------------------------------------------------------- token budget
def test_the_token_budget_leaves_room_for_a_sentence_around_required_words():
    assert token_budget(LM, word_count(exactly=11)) == 2 * 11 + 12
    room = token_budget(LM, contains_words(["jaw"]))
    assert room >= WORDS_PER_SENTENCE * TOKENS_PER_WORD
    # what a conjunction implies adds no room; plain characters neither
    assert token_budget(LM, word_count(exactly=11, plain=False)) == 2 * 11 + 12
    with pytest.raises(TypeError, match="constraint"):
        token_budget(LM, lambda text: True)


# ---------------------------------------------------------------------- the guide
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "programs" / "collie.md"
BUILDERS = [
    "char_count",
    "chars_at",
    "word_count",
    "sentence_count",
    "paragraph_count",
    "words_at",
    "chars_per_word",
    "words_per_sentence",
    "sentences_per_paragraph",
    "contains_words",
    "excludes_words",
    "first_word_of_sentences",
    "last_word_of_sentences",
    "last_sentence_of_paragraphs",
    "plain_characters",
]


@pytest.mark.parametrize("name", BUILDERS)
def test_the_guide_names_every_keyword_of_every_builder(name):
    """Each builder has its own section in ``docs/programs/collie.md`` with its signature and a
    row per keyword, so a user finds them without reading docstrings."""
    import llamppl.constraints as lc

    builder = getattr(lc, name)
    params = list(inspect.signature(builder).parameters)
    guide = GUIDE.read_text(encoding="utf-8")
    head = f"#### `{name}("
    assert head in guide, f"no section {head!r} in {GUIDE.name}"
    section = guide.split(head, 1)[1].split("\n#", 1)[0]
    missing = [p for p in params if f"| `{p}` |" not in section]
    assert not missing, f"{name}: keywords without a row in the guide: {missing}"
    assert all(p in section.split("\n", 1)[0] for p in params)  # and in the signature shown
