r"""What is already certain about the sentences and words of a text prefix, fast enough to
run on every candidate token.

A text-structure constraint (:mod:`~llamppl.decoding.text.builders`) must answer "can this
prefix still be completed?" for every token a lazy draw visits, so its view of the prefix
must be *sound* (nothing it calls certain changes in any continuation), *tight* (a unit a
continuation can no longer change is called certain as early as possible) and *cheap*.
:func:`analyze` gives that view at sentence and word level
(:func:`~llamppl.decoding.text.paragraphs.analyze_paragraphs` one level up)::

    from llamppl.decoding.text.prefix import analyze
    a = analyze("He left. The dog ran aw")
    [s.text for s in a.sentences]   # ['He left']            certain sentences
    a.open_flat, a.open_word        # ('The', 'dog', 'ran'), OpenWord('aw', closed=False)

How a prefix is read
--------------------
1. **Certain sentences.** From the start, repeatedly: the sentences that
   :func:`~llamppl.decoding.text.finality.final_sentence_spans` calls final (Punkt's decision
   can no longer change, one or two chunks after the mark), and one rule of our own that
   decides a boundary one chunk earlier: when the last chunk of the first open sentence is
   a run of ASCII letters (apostrophes inside allowed: ``Barnaby's``) followed by a single
   ``?`` or ``!``, or by ``.`` after at least two letters that are neither an abbreviation of
   the Punkt model nor the first word of one of its collocations, and whitespace then a
   letter follow, the boundary is certain.
   (Punkt's first pass marks such a period as a break; its second pass only revises breaks
   after abbreviations, initials, ellipses, numbers and collocations, none of which applies;
   a next sentence that starts with a letter is never realigned. ``?`` and ``!`` are breaks
   whatever follows.) The *open region* starts after the certain sentences.
2. **The open region.** Cut it at single spaces into chunks (the empty chunks of a run of
   spaces add no words). Every *complete* chunk (a space follows) that holds no ``.``,
   ``?``, ``!`` nor whitespace of another kind is tokenised by the judge's Treebank rules
   on its own (they act inside a chunk, the sentence edges aside, and no sentence boundary
   can fall inside a region without marks), so its words are certain. If every chunk so
   far is of that kind and the last, unfinished chunk is ASCII letters (optionally one
   ``,``, ``;`` or ``:`` after them), the analysis is *exact*: it knows every word of the
   region and the word being written (:class:`OpenWord`). Otherwise
   the region's certain words are the longest of that simple run and what
   :func:`~llamppl.decoding.text.finality.split_prefix` calls final.
3. **The word being written** (:class:`OpenWord`, letters ``L``) becomes, in every
   continuation, a word that starts with ``L``, or one of three shorter forms the Treebank
   rules can cut out of it: ``L`` without its last ``n`` (``don`` + ``'t`` gives ``do``,
   ``n't``) and ``can``, ``gim``, ``gon``, ``got``, ``lem``, ``wan`` when ``L`` (or ``L``
   without that ``n``) is a longer prefix of ``cannot``, ``gimme``, ``gonna``, ``gotta``,
   ``lemme``, ``wanna``.

The result is a pure function of the text (memoised per text); a *parent* (the text minus
its last token, already analysed) only makes it faster: the certain sentences of a prefix
stay certain, so the work restarts at the parent's open region, and a token that only adds
letters, spaces and simple punctuation extends the parent's region without calling NLTK.
``tests/decoding/test_text_prefix.py`` checks it by brute force: on every prefix of
the COLLIE reference texts and of seeded random texts, nothing called certain ever differs
from the judge's units of a longer prefix, and the analysis with a parent equals the
analysis from scratch.
"""

from __future__ import annotations

import functools
import re
import string
from dataclasses import dataclass

from llamppl.decoding.text import finality as tf
from llamppl.decoding.text import units as tu
from llamppl.lm.memo import LRU

__all__ = [
    "Sentence",
    "OpenWord",
    "Analysis",
    "MEMO_SIZE",
    "analyze",
    "sentence_of",
    "floor_words",
    "word_floor",
    "chunk_words",
    "punkt_tables",
    "next_chunk",
]

_ASCII_WS = frozenset(string.whitespace)
_MARK = re.compile(r"[.?!]")
_BAD_IN_CHUNK = re.compile(r"[.?!\s]")
_OPEN_WORD = re.compile(r"([A-Za-z]+)([,;:]?)")
_MARK_CHUNK = re.compile(r"([A-Za-z]+(?:'[A-Za-z]+)*)([.?!])")
_COMPLETE_CHUNK = re.compile(f"[^{re.escape(string.whitespace)}]+[{re.escape(string.whitespace)}]")
_ALNUM = re.compile(r"[^\W_]")  # a letter or digit
_CONTRACTIONS = (
    ("can", "cannot"),
    ("gim", "gimme"),
    ("gon", "gonna"),
    ("got", "gotta"),
    ("lem", "lemme"),
    ("wan", "wanna"),
)
MEMO_SIZE = 20_000


# ---------------------------------------------------------------------- value types
@dataclass(frozen=True)
class Sentence:
    """A certain sentence of a prefix.

    Attributes
    ----------
    text
        The judge's sentence unit (the span, stripped, outer periods removed).
    words
        Its words as COLLIE nests them (``InputLevel(sentence)``, ``TargetLevel(word)``:
        the words of the cleaned sentence).
    flat
        Its share of the whole text's word list (``TargetLevel(word)`` on the text: the
        Treebank words of the raw span).
    """

    text: str
    words: tuple[str, ...]
    flat: tuple[str, ...]


@functools.lru_cache(maxsize=MEMO_SIZE)
def sentence_of(span: str) -> Sentence:
    """The :class:`Sentence` of one raw sentence span (memoised)."""
    cleaned = span.strip().strip(".")
    return Sentence(cleaned, tuple(tu.words(cleaned)), tuple(tu.span_words(span)))


@dataclass(frozen=True)
class OpenWord:
    """The word being written: ASCII letters at the very end of the prefix.

    ``closed`` is True when one ``,``, ``;`` or ``:`` follows the letters (the word's
    letters are then complete, though digits may still join it, ``a,1``, and the contraction
    rule still cuts ``gotta:`` into ``got``, ``ta``).
    """

    letters: str
    closed: bool = False

    def shorter_forms(self) -> tuple[str, ...]:
        """Words shorter than ``letters`` that the Treebank rules may still cut out of it."""
        bases = [self.letters]
        if not self.closed and len(self.letters) >= 2 and self.letters[-1] in "nN":
            # "don" + "'t" -> "do", "n't"
            bases.append(self.letters[:-1])
        out = bases[1:]
        for base in bases:  # "gonna" -> "gon", "na" (also after a "n't" cut: "wannan't")
            low = base.lower()
            out += [
                base[: len(first)]
                for first, full in _CONTRACTIONS
                if full.startswith(low) and len(low) > len(first)
            ]
        return tuple(out)

    def cuts(self) -> tuple[tuple[str, ...], ...]:
        """The words the Treebank rules may cut the finished word into, when they cut it:
        ``don`` + ``'t`` gives ``do``, ``n't``; ``gonn`` + ``a`` gives ``gon``, ``na``
        (:meth:`shorter_forms` with the words after them)."""
        out: list[tuple[str, ...]] = []
        bases: list[tuple[str, tuple[str, ...]]] = [(self.letters, ())]
        if not self.closed and len(self.letters) >= 2 and self.letters[-1] in "nN":
            out.append((self.letters[:-1], "n't"))
            bases.append((self.letters[:-1], ("n't",)))
        for base, after in bases:
            low = base.lower()
            for first, full in _CONTRACTIONS:
                grows = not after and full.startswith(low)  # the word may still grow to full
                if (grows or low == full) and len(low) > len(first):
                    out.append((base[: len(first)], full[len(first) :], *after))
        return tuple(out)

    def may_become(self, target: str) -> bool:
        """Whether the word, once finished, may equal ``target`` under COLLIE's comparison
        (``target`` already normalised: :func:`~llamppl.decoding.text.units.normalize`)."""
        if target.startswith(self.letters.lower()):
            return True
        return any(tu.normalize(w) == target for w in self.shorter_forms())

    def min_length(self) -> int:
        """The fewest characters the finished word can have."""
        return min([len(self.letters), *map(len, self.shorter_forms())])


@dataclass(frozen=True)
class Analysis:
    """What is certain about a text prefix at sentence and word level (see the module docstring).

    Attributes
    ----------
    anchor
        Where the open region starts (after the certain sentences and the whitespace after them).
    sentences
        The certain sentences (every continuation's sentences start with these).
    flat
        The whole-text words of the certain sentences, in order.
    open_flat
        Certain words at the start of the open region, as the whole text's word list has them.
    open_nested
        Certain words at the start of the first open sentence, as COLLIE nests them.
    open_word
        The word being written, when ``exact``; else None.
    exact
        The open region's words are exactly ``open_flat`` and, if any, ``open_word``; the
        region has no mark, so it belongs to one sentence.
    content
        The open region has non-whitespace text (so one more sentence is certain).
    tail
        Where the last chunk of an exact region starts (internal: fast extension).
    """

    anchor: int
    sentences: tuple[Sentence, ...]
    flat: tuple[str, ...]
    open_flat: tuple[str, ...]
    open_nested: tuple[str, ...]
    open_word: OpenWord | None
    exact: bool
    content: bool
    tail: int

    @property
    def certain_words(self) -> int:
        """A lower bound on the number of words of every continuation."""
        return len(self.flat) + len(self.open_flat) + (self.open_word is not None)

    def word_at(self, index: int) -> str | None:
        """The certain whole-text word at ``index`` (>= 0), or None when not yet certain."""
        n = len(self.flat)
        if index < n:
            return self.flat[index]
        if index - n < len(self.open_flat):
            return self.open_flat[index - n]
        return None


# ---------------------------------------------------------------------- building blocks
def _skip_space(text: str, i: int) -> int:
    """The first non-whitespace offset from ``i`` (any whitespace: a sentence after a boundary
    starts after Punkt's ``\\s+``, which includes ``\\xa0``)."""
    while i < len(text) and text[i].isspace():
        i += 1
    return i


@functools.lru_cache(maxsize=MEMO_SIZE)
def chunk_words(chunk: str, first: bool) -> tuple[str, ...]:
    """The judge's words of one complete chunk without marks (``first``: it opens the sentence)."""
    return tuple(tu.span_words((chunk if first else " " + chunk) + " "))


@functools.lru_cache(maxsize=1)
def punkt_tables() -> tuple[frozenset, frozenset]:
    """The Punkt model's abbreviations and the first words of its collocations."""
    params = tu.punkt_parameters()
    return frozenset(params.abbrev_types), frozenset(a for a, _ in params.collocations)


def _certain_boundary(region: str, first: tuple[int, int], second: tuple[int, int]) -> bool:
    """Our early rule (module docstring, step 1) for the boundary between the first two spans."""
    start, end = first
    nxt = second[0]
    gap = region[end:nxt]
    if not gap or any(ch not in _ASCII_WS for ch in gap):
        return False
    if not (region[nxt].isascii() and region[nxt].isalpha()):
        return False
    sentence = region[start:end]
    cut = max(sentence.rfind(ch) for ch in _ASCII_WS) + 1
    match = _MARK_CHUNK.fullmatch(sentence[cut:])
    if match is None:
        return False
    letters, mark = match.groups()
    if mark == ".":
        abbrev, colloc = punkt_tables()
        low = letters.lower()
        if len(letters) < 2 or low in abbrev or low in colloc:
            return False
    return True


def _advance(
    text: str, anchor: int, sentences: tuple[Sentence, ...], flat: tuple[str, ...]
) -> tuple[int, tuple[Sentence, ...], tuple[str, ...]]:
    """Move the anchor over every sentence that is certain (module docstring, step 1)."""
    anchor = _skip_space(text, anchor)
    while _MARK.search(text, anchor):
        region = text[anchor:]
        spans, n_final, open_start = tf.final_sentence_spans(region)
        if n_final:
            new = [sentence_of(region[s:e]) for s, e in spans[:n_final]]
            anchor = _skip_space(text, anchor + open_start)
        elif len(spans) >= 2 and _certain_boundary(region, spans[0], spans[1]):
            new = [sentence_of(region[spans[0][0] : spans[0][1]])]
            anchor += spans[1][0]
        else:
            break
        sentences = sentences + tuple(new)
        flat = flat + tuple(w for s in new for w in s.flat)
    return anchor, sentences, flat


def _region(
    text: str,
    anchor: int,
    sentences: tuple[Sentence, ...],
    flat: tuple[str, ...],
    start: int,
    known: tuple[str, ...],
) -> Analysis:
    """Read the open region ``text[anchor:]`` from ``start`` (a chunk start; ``known`` are the
    certain words before it) as in the module docstring, step 2."""
    words = list(known)
    pos, n = start, len(text)
    while True:
        space = text.find(" ", pos)
        if space < 0:  # the last, unfinished chunk
            match = _OPEN_WORD.fullmatch(text, pos)
            if pos == n or match is not None:
                open_word = None if pos == n else OpenWord(match[1], bool(match[2]))
                known_t = tuple(words)
                return Analysis(
                    anchor, sentences, flat, known_t, known_t, open_word, True, n > anchor, pos
                )
            break
        chunk = text[pos:space]
        if chunk and _BAD_IN_CHUNK.search(chunk):
            break
        if chunk:  # an empty chunk (a second space) adds no words: the rules split on runs
            words += chunk_words(chunk, pos == anchor)
        pos = space + 1
    # not exact: the simple run, or NLTK's finality on the region when it knows more (a
    # chunk is final there once two complete chunks end at or after it; three when nested)
    region = text[anchor:]
    simple = nested = tuple(words)
    ahead = len(_COMPLETE_CHUNK.findall(text, pos))
    if ahead >= 2:
        final = tf.split_prefix(region, "word").final
        if len(final) > len(simple):
            simple = final
    if ahead >= 3:
        open_final = tf.split_prefix_nested(region, "sentence", "word").open_final
        if len(open_final) > len(nested):
            nested = open_final
    return Analysis(anchor, sentences, flat, simple, nested, None, False, n > anchor, n)


# ---------------------------------------------------------------------- entry points
_ANALYSES: LRU[str, Analysis] = LRU(MEMO_SIZE)


def analyze(text: str, parent: str | None = None) -> Analysis:
    """The certain sentences and words of the prefix ``text`` (module docstring).

    Parameters
    ----------
    text
        The prefix.
    parent
        Optional: a shorter prefix of ``text`` (typically ``text`` minus its last token)
        whose analysis may be reused. The result is the same with or without it.

    Returns
    -------
    Analysis
        Memoised per text (an LRU of 20,000 prefixes shared by all constraints).
    """
    found = _ANALYSES.get(text)
    if found is not None:
        return found
    base = _ANALYSES.get(parent) if parent is not None and text.startswith(parent) else None
    if base is None:
        anchor, sentences, flat = _advance(text, 0, (), ())
        result = _region(text, anchor, sentences, flat, anchor, ())
    elif base.exact and not _MARK.search(text, base.tail) and base.anchor < len(parent):
        # a token of letters, spaces and marks-free punctuation: extend the parent's region
        result = _region(text, base.anchor, base.sentences, base.flat, base.tail, base.open_flat)
    else:
        anchor, sentences, flat = _advance(text, base.anchor, base.sentences, base.flat)
        result = _region(text, anchor, sentences, flat, anchor, ())
    _ANALYSES.put(text, result)
    return result


def floor_words(text: str, view: Analysis) -> tuple[tuple[str, str], ...]:
    """The fewest words of the open region ``text[view.anchor:]``, one entry per word, read
    chunk by chunk (whitespace-separated pieces; the Treebank rules split only within them,
    and a sentence boundary only cuts one in two):

    - ``("word", w)``: a word of a complete chunk (whitespace follows) that starts with an
      ASCII letter and holds no ``.``, ``?`` or ``!``: the Treebank rules give its words on
      its own, wherever sentences start or end (``Winter's`` is ``Winter``, ``'s``);
    - ``("chunk", c)``: another complete chunk holding a letter or digit: at least one word
      (a token with a letter or digit is never dropped as punctuation);
    - ``("open", c)``: the text's last chunk, when it holds a letter or digit: at least one
      word, which may still grow.

    So every continuation has at least ``len(view.flat) + len(floor_words(...))`` words
    (:func:`word_floor`), and when that is all the words it may have, each entry is exactly
    one word and a ``"chunk"`` compares as the chunk itself (``normalize(c)``: what the
    Treebank rules split off it is punctuation).
    """
    region = text[view.anchor :]
    chunks = region.split()
    out: list[tuple[str, str]] = []
    for k, chunk in enumerate(chunks):
        if not _ALNUM.search(chunk):
            continue
        if k == len(chunks) - 1 and not region[-1:].isspace():
            out.append(("open", chunk))
        elif chunk[0].isascii() and chunk[0].isalpha() and not _BAD_IN_CHUNK.search(chunk):
            out += [("word", w) for w in chunk_words(chunk, False)]
        else:
            out.append(("chunk", chunk))
    return tuple(out)


_LEAD = re.compile(r"[A-Za-z]*")


def next_chunk(text: str, view: Analysis) -> tuple[str, bool] | None:
    """What an analysis that is not exact still knows about the chunk where its simple run of
    complete chunks stopped (a chunk with a mark, or the last one with more than letters):
    ``(letters, word)``: the ASCII letters that open it (``""``: none) and whether it holds a
    letter or digit before its first ``.``, ``?`` or ``!``. Every continuation then has, as
    its next word after ``view.open_flat`` (and ``view.open_nested``), a word that starts with
    those letters or one the Treebank rules cut out of them (:class:`OpenWord`); and when
    ``word``, that word belongs to the first open sentence (no boundary before a mark). None
    when the view is exact, or when finality knows more words than the simple run."""
    if view.exact:
        return None
    region, pos, words = text[view.anchor :], 0, 0
    while True:
        space = region.find(" ", pos)
        chunk = region[pos:] if space < 0 else region[pos:space]
        if space < 0 or (chunk and _BAD_IN_CHUNK.search(chunk)):
            break
        if chunk:
            words += len(chunk_words(chunk, pos == 0))
        pos = space + 1
    if words != len(view.open_flat) or words != len(view.open_nested) or not chunk:
        return None
    head = _MARK.split(chunk, 1)[0]
    return _LEAD.match(chunk).group(), _ALNUM.search(head) is not None


def word_floor(text: str, view: Analysis) -> int:
    """The fewest words every continuation of ``text`` has: the certain words
    (``view.certain_words``), or the certain sentences' words and :func:`floor_words`,
    whichever is more. Tighter than the certain words where marks or quotes leave the
    region's words undecided (``Mr. Black endures the`` has at least 9 words)."""
    return max(view.certain_words, len(view.flat) + len(floor_words(text, view)))
