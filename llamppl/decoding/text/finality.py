r"""Which units of a text *prefix* are already final, at COLLIE's unit levels.

:mod:`~llamppl.decoding.text.units` splits whole texts exactly as COLLIE's judge does
(characters, words, sentences, paragraphs; it also loads NLTK and the Punkt data this
module needs). A language model writes text left to right; a constraint must know which
units of the text so far can no longer change. :func:`split_prefix` answers that::

    from llamppl.decoding.text.finality import split_prefix
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
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from llamppl.decoding.text import units as tu
from llamppl.validation import check_nonnegative_int

__all__ = [
    "settled_end",
    "PrefixUnits",
    "NestedPrefix",
    "split_prefix",
    "split_prefix_nested",
    "final_sentence_spans",
]

_NOT_ASCII_SPACE = re.compile(f"[^{re.escape(string.whitespace)}]+")
_QUOTE_IN_TEXT = re.compile(r"``|'{2}|\"")


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
    tu.check_text("prefix", prefix)
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
    raw = list(tu.punkt_tokenizer().span_tokenize(text, realign_boundaries=False))
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
    treebank = tu.treebank_tokenizer()
    from nltk.tokenize.util import align_tokens  # nltk is importable: the line above loaded it

    tokens = treebank.tokenize(sentence)
    aligned = tokens
    if '"' in sentence or "''" in sentence:
        quotes = [m.group() for m in _QUOTE_IN_TEXT.finditer(sentence)]
        aligned = [quotes.pop(0) if tok in ('"', "``", "''") and quotes else tok for tok in tokens]
    try:
        spans = align_tokens(aligned, sentence)
    except ValueError:  # a token that is not a substring: claim nothing in this sentence
        return 0
    return sum(1 for tok, (_, end) in zip(tokens, spans) if end <= limit and tu.keep_word(tok))


def final_sentence_spans(prefix: str) -> tuple[list[tuple[int, int]], int, int]:
    """The sentence spans of a prefix and how many of them are final.

    Returns
    -------
    tuple
        ``(spans, n_final, open_start)``: the
        :func:`~llamppl.decoding.text.units.sentence_spans` of ``prefix``, the number of
        leading spans that are final (``split_prefix(prefix, "sentence").final`` are their
        cleaned texts) and where the open text begins (``open_start`` of :class:`PrefixUnits`).
    """
    tu.check_text("prefix", prefix)
    spans = tu.sentence_spans(prefix)
    n_final, open_start = _final_sentence_count(prefix, spans, settled_end(prefix))
    return spans, n_final, open_start


def _split_sentences(prefix: str, settled: int) -> PrefixUnits:
    spans = tu.sentence_spans(prefix)
    n_final, open_start = _final_sentence_count(prefix, spans, settled)
    cleaned = tuple(tu.clean_unit(prefix[s:e]) for s, e in spans)
    return PrefixUnits(cleaned[:n_final], cleaned[n_final:], open_start)


def _split_words(prefix: str, settled: int) -> PrefixUnits:
    spans = tu.sentence_spans(prefix)
    n_final, open_start = _final_sentence_count(prefix, spans, settled)
    per_sentence = [
        [
            tu.clean_unit(tok)
            for tok in tu.treebank_tokenizer().tokenize(prefix[s:e])
            if tu.keep_word(tok)
        ]
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
    pieces = prefix.split(tu.PARAGRAPH_DELIMITER)
    cleaned = tuple(tu.clean_unit(p) for p in pieces)
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
    tu.check_text("prefix", prefix)
    level = tu.check_level("level", level)
    if level == "character":
        return PrefixUnits(tuple(tu.characters(prefix)), (), len(prefix))
    if level == "paragraph":
        return _split_paragraphs(prefix)
    if level == "sentence":
        return _split_sentences(prefix, settled_end(prefix))
    return _split_words(prefix, settled_end(prefix))


def _cleaned_offset(text: str) -> int:
    """Where ``clean_unit(text)`` starts inside ``text``."""
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
        Levels from :data:`~llamppl.decoding.text.units.LEVELS`; ``outer`` is not ``"character"``.

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
    tu.check_text("prefix", prefix)
    outer = tu.check_level("outer", outer, tu.LEVELS[1:])
    inner = tu.check_level("inner", inner)
    if outer == "paragraph":
        top = _split_paragraphs(prefix)
    elif outer == "sentence":
        top = _split_sentences(prefix, settled_end(prefix))
    else:
        top = _split_words(prefix, settled_end(prefix))
    final = tuple(tuple(tu.units(u, inner)) for u in top.final)
    pending = tuple(tuple(tu.units(u, inner)) for u in top.pending)
    open_final: tuple[str, ...] = ()
    if outer != "word" and top.pending:
        region = prefix[top.open_start :]
        text = tu.clean_unit(region)
        offset = top.open_start + _cleaned_offset(region)
        if outer == "paragraph":
            # paragraph boundaries are whitespace: the open piece's own chunks decide
            limit = settled_end(text)
        else:
            # a later sentence boundary may cut the chunk after z: one chunk of margin
            limit = max(0, settled_end(prefix, margin=1) - offset)
        if inner == "character":
            open_final = tuple(tu.characters(text[:limit]))
        elif inner == "word":
            open_final = _split_words(text, limit).final
        elif inner == "sentence":
            open_final = _split_sentences(text, limit).final
        else:
            open_final = _split_paragraphs(text[:limit]).final if limit else ()
    return NestedPrefix(final, open_final, pending, top.open_start)
