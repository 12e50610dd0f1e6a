"""The SMILES constraint (``llamppl.decoding.chemistry``): verdicts, closure under prefixes, cost.

- the prefix and complete checks on short strings, and partialsmiles' own verdicts where
  the text ends on a whole symbol;
- the texts where ``ParseSmiles(partial=True)`` alone is not closed under prefixes
  (``"[A"`` / ``"[Al"``, ``"C1CC$C"`` / ``"C1CC$Cl"``, ``"%1"`` / ``"%12"``) are accepted;
- closure under prefixes (the constraint declares it): on prefixes of the GDB-17 sample's
  molecules, their one-character edits and random junk, a rejected text has no accepted
  extension, and every accepted text's one-character-shorter prefix is accepted;
- the mask listed on the vocabulary's trie equals the per-token scan;
- :func:`open_closures`, the guide count.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

from llamppl import FunctionLM
from llamppl.decoding.chemistry import CHEM_EXTRA, Smiles, open_closures, smiles
from llamppl.decoding.chemistry.smiles import require_partialsmiles, symbol_endings
from llamppl.decoding.constraints import CheckTimeout, bounded_call, time_bound

ps = pytest.importorskip("partialsmiles")

GDB17 = Path(__file__).resolve().parents[1] / "data" / "molecules" / "GDB17_sample.txt"
ALPHABET = "CcNnOoSsPpBbFIlr[]()=#-+@H0123456789%./\\$AaZzTtMeg*"


def molecules() -> list[str]:
    """The GDB-17 sample (30 molecules, kept in ``tests/data/molecules``)."""
    return [line.strip() for line in GDB17.read_text().splitlines() if line.strip()]


def raw_partial(text: str) -> bool:
    try:
        ps.ParseSmiles(text, partial=True)
    except Exception:  # noqa: BLE001 - partialsmiles raises several error types
        return False
    return True


# ---------------------------------------------------------------------- verdicts


@pytest.mark.parametrize(
    ("text", "prefix", "complete"),
    [
        ("", True, False),
        ("C", True, True),
        ("CC(", True, False),
        ("CC(=O)O", True, True),
        ("c1cc", True, False),
        ("c1ccccc1", True, True),
        ("C1CC", True, False),  # an open ring: not yet a molecule
        ("[NH4+", True, False),
        ("[NH4+]", True, True),
        ("C)", False, False),  # unmatched parenthesis
        ("CX", False, False),  # no element X
        ("hello", False, False),
        ("C=C(=C)=C", False, False),  # a five-valent carbon, whatever follows
        (" CC", False, False),  # a space is no SMILES character without leading_space
    ],
)
def test_prefix_and_complete_verdicts_on_short_strings(text, prefix, complete):
    c = smiles()
    assert c(text) is prefix and c.accepts_end(text) is complete


def test_the_checks_agree_with_partialsmiles_on_texts_that_end_on_a_whole_symbol():
    c = smiles()
    texts = ["CC(=O)O", "C1CC1", "c1ccccc1O", "N#CC", "C(", "CC(C)(C)(C)C", "c1cccc1", "OO("]
    for text in texts:
        assert c(text) is raw_partial(text), text
        complete = True
        try:
            ps.ParseSmiles(text, partial=False)
        except Exception:  # noqa: BLE001
            complete = False
        assert c.accepts_end(text) is complete, text


@pytest.mark.parametrize(
    ("stopped", "finished"),
    [
        ("[A", "[Al"),  # a bracket atom's element being written: Al, Ag, Ar, ...
        ("[t", "[te"),  # aromatic tellurium
        ("B[M", "B[Mo"),
        ("C1CC#B", "C1CC#Br"),  # four bonds: too many for boron, allowed for bromine
        ("BrC1=C2C3CC3C=CCC#B", "BrC1=C2C3CC3C=CCC#Br"),
        ("C%12CC#C%1", "C%12CC#C%12"),  # a two-digit ring label being written
    ],
)
def test_a_text_stopped_inside_a_symbol_is_judged_with_the_symbol_finished(stopped, finished):
    assert not raw_partial(stopped) and raw_partial(finished)  # partialsmiles is not closed
    c = smiles()
    assert c(stopped) and c(finished)
    assert symbol_endings(stopped)  # the ending that finishes the symbol is tried


def test_symbol_endings_name_the_unfinished_symbols_only():
    assert "l" in symbol_endings("[A") and "g" in symbol_endings("[13A")
    assert symbol_endings("CC") == ["l"] and symbol_endings("CB") == ["r"]
    assert symbol_endings("C%12CC%") == ["12"] and symbol_endings("C%12CC%1") == ["2"]
    assert symbol_endings("") == [] and symbol_endings("CO") == [] and symbol_endings("[C@") == []
    assert symbol_endings("[Al") == [] and symbol_endings("C%1") == []  # no earlier label


def test_one_leading_space_is_ignored_when_allowed():
    c = smiles(leading_space=True)
    assert c(" ") and c(" CC(") and c("CC(") and c.accepts_end(" CC(=O)O")
    assert not c("  C") and not c.accepts_end(" ") and not c(" C)")
    assert c.smiles_text(" CCO") == "CCO" and c.smiles_text("CCO") == "CCO"
    assert repr(c) == "smiles(leading_space=True)"


def test_bad_arguments_and_a_missing_package_are_named(monkeypatch):
    with pytest.raises(TypeError, match="leading_space must be a bool"):
        smiles(leading_space="yes")
    with pytest.raises(TypeError, match="text must be a str"):
        smiles()(b"CC")
    with pytest.raises(ValueError, match="cache_size"):
        Smiles(cache_size=0)
    with pytest.raises(TypeError, match="text must be a str"):
        open_closures(None)
    monkeypatch.setitem(sys.modules, "partialsmiles", None)
    with pytest.raises(ImportError, match=r"pip install 'llamppl\[chem\]'") as err:
        smiles()
    assert CHEM_EXTRA in str(err.value)
    with pytest.raises(ImportError, match="partialsmiles"):
        require_partialsmiles()


def test_a_slow_check_is_cut_by_the_librarys_time_bound():
    class Slow(Smiles):
        def parse(self, smiles_text: str, partial: bool) -> bool:
            while True:
                pass

    with time_bound(0.05), pytest.raises(CheckTimeout):
        bounded_call(Slow(), "CC")


# ---------------------------------------------------------------------- closure under prefixes


def _texts(seed: int = 0, n_random: int = 3000) -> list[str]:
    """Prefixes of the sample's molecules, each with every one-character continuation, then
    random continuations of random prefixes and random junk."""
    rng = random.Random(seed)
    mols = molecules()
    texts = {m[:i] + ch for m in mols for i in range(len(m) + 1) for ch in ("", *ALPHABET)}
    for _ in range(n_random):
        m = rng.choice(mols)
        cut = rng.randrange(len(m) + 1)
        tail = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(1, 5)))
        texts.add(m[:cut] + tail)
        texts.add("".join(rng.choice(ALPHABET) for _ in range(rng.randrange(1, 6))))
    return sorted(texts)


def test_every_prefix_of_a_valid_molecule_is_accepted_and_the_molecule_ends():
    c = smiles()
    for m in molecules():
        assert all(c(m[:i]) for i in range(len(m) + 1)), m
        assert c.accepts_end(m) and raw_partial(m)


def test_the_prefix_check_is_closed_under_prefixes():
    """Closed iff an accepted text's one-character-shorter prefix is accepted; and no
    extension of a rejected text is accepted (checked on its one-character continuations and
    random longer ones, each by a fresh constraint, so no remembered verdict decides it)."""
    c = smiles()
    texts = random.Random(0).sample(_texts(), 15_000)
    accepted = {t for t in texts if c(t)}
    assert 0.05 < len(accepted) / len(texts) < 0.95  # both verdicts are well represented
    for t in accepted:
        assert t == "" or t[:-1] in accepted or c(t[:-1]), t
    rng = random.Random(1)
    rejected = [t for t in texts if t not in accepted]
    for t in rng.sample(rejected, min(200, len(rejected))):
        fresh = smiles()
        for ch in ALPHABET:
            assert not fresh(t + ch), t + ch
        tail = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(2, 6)))
        assert not smiles()(t + tail), t + tail


def test_it_rejects_only_what_partialsmiles_rejects_on_these_texts():
    """Stricter than partialsmiles nowhere here; more lenient only inside a symbol."""
    c = smiles()
    texts = random.Random(2).sample(_texts(seed=2, n_random=1000), 6000)
    assert not [t for t in texts if raw_partial(t) and not c(t)]
    extra = [t for t in texts if c(t) and not raw_partial(t)]
    assert all(any(raw_partial(t + y) for y in symbol_endings(t)) for t in extra)


def test_a_token_costs_one_parse_per_character_once_its_prefix_is_known():
    c = smiles()
    assert c("CC(=O)")
    before = c.parses
    assert c("CC(=O)Oc1")  # three more characters
    assert c.parses - before == 3
    assert c("CC(=O)Oc1") and c.parses - before == 3  # remembered


# ---------------------------------------------------------------------- the mask on the trie

VOCAB = ["C", "Cl", "C1", "C(", "c", "c1", "1", "(", ")", "=", "=O", "O", "N", "[", "[A", "[Al"]
VOCAB += ["l", "r", "Br", "B", "#", "$", "%", "%1", "X", "<eos>"]
LM = FunctionLM(VOCAB, len(VOCAB) - 1, lambda ctx: [0.0] * len(VOCAB))


@pytest.mark.parametrize("text", ["", "C", "C1CC#", "CC(", "C1C", "[", "C%12CC#", "C)"])
def test_the_mask_listed_on_the_trie_is_the_per_token_scan(text):
    c = smiles()
    mask = c.allowed_mask(LM, text)  # (V,) bool, listed on the vocabulary's trie (closed)
    scan = torch.tensor([smiles()(text + t) for t in LM.vocab])
    scan[LM.eos_token_id] = smiles()(text) and smiles().accepts_end(text)
    assert torch.equal(mask, scan & smiles()(text))


# ---------------------------------------------------------------------- open_closures


def test_open_closures_counts_open_rings_and_branches():
    assert open_closures("") == 0 and open_closures(" CC(=O)O") == 0
    assert open_closures(" BrC1=C2C3CC(C") == 4  # rings 1, 2, 3 and one branch
    assert open_closures("C1CC1") == 0 and open_closures("C1CC2CC1") == 1
    assert open_closures("C%12CC") == 1 and open_closures("C%12CC%12") == 0
    assert open_closures("C[NH3+]") == 0  # digits inside brackets are not ring labels
    assert open_closures("C1CC[N") == 1  # an unfinished bracket atom hides nothing
