"""Every proposal of HardConstraint targets the sampling formulation, on programs where each
part of the lazy draw really runs.

The reference is :func:`~exact_reference.sampling_target`: the definition (every whole
token's text checked, an end token allowed iff the complete check passes) summed over every
token path by brute force, independent of the library's constraint code. Each program
counts the machinery it exercises, so that a test cannot pass by not running it:

- ``RICH``: ``cheap & costly`` (the lazy draw masks with the cheap part and checks the
  costly one), a costly part closed under prefixes (so long runs of rejections are listed
  on the vocabulary's trie; the listing is made to start after one rejection), hints, and
  ``stop="newline"`` with newline tokens that the cheap part's mask forbids inside a text;
- ``FLAT``: a flat LM over 30 tokens and a check that allows about half of them, so the
  weight's last check often meets a large unseen mass (the AWRS estimator's ``u 1_A(b)``);
- ``NOT_CLOSED``: a plain callable that rejects a text ending in "x" but accepts "xy".

Estimates are tested with :func:`~exact_reference.assert_unbiased_paths` (4 measured
standard errors, no floor, no weight outside the target).
"""

from __future__ import annotations

import math

import pytest
import torch
from exact_reference import assert_unbiased_paths, path_of, sampling_target, weighted_paths

from llamppl import FunctionLM, run
from llamppl.decoding.constraints.protocol import Constraint, PredicateConstraint
from llamppl.decoding.proposals import lazy as lazy_proposal
from llamppl.decoding.proposals import token_check
from llamppl.inference import enumerate_exact, smc_standard
from llamppl.models import HardConstraint, constraint_formulations

RUNS = 400  # seeded SMC runs per estimate (N = 4)


# ---------------------------------------------------------------- RICH
RICH_VOCAB = ["a", "b", "c", "ab", "ba", "ca", "bb", "q", "qa", "\n", "a\n", "q\n", "<eos>"]
RICH_EOS = len(RICH_VOCAB) - 1
RICH_NEWLINES = {9, 10, 11}


def _rich_logits(ctx):
    n, last = len(ctx), ctx[-1]
    return [math.cos(0.9 * i + 0.6 * n + 0.5 * last) for i in range(RICH_EOS)] + [0.3 * n - 1.0]


RICH_LM = FunctionLM(RICH_VOCAB, RICH_EOS, _rich_logits)


class OneLineNoQ(Constraint):
    """Cheap (a vectorised mask): no "q" and no newline in the text."""

    prefix_closed = True

    def __call__(self, text: str) -> bool:
        return "q" not in text and "\n" not in text

    def allowed_mask(self, lm, text: str) -> torch.Tensor:
        mask = torch.tensor([self(text + t) for t in lm.vocab])
        mask[list(lm.eos_token_ids)] = self(text)
        return mask


def _no_repeat(text: str) -> bool:
    """No letter twice in a row, at most 4 characters (closed under prefixes)."""
    return len(text) <= 4 and all(a != b for a, b in zip(text, text[1:]))


class HintedNoRepeat(PredicateConstraint):
    """The costly part: ``_no_repeat``, closed under prefixes, with hints; a text may end
    only on an "a" (or empty)."""

    def accepts_end(self, text: str) -> bool:
        return _no_repeat(text) and (text == "" or text.endswith("a"))

    def hint(self, lm, state):
        return (0, 5) if not state.endswith("a") else (1, 2)


def _rich_constraint():
    return OneLineNoQ() & HintedNoRepeat(_no_repeat, prefix_closed=True)


def _rich_target(max_tokens=3):
    cheap, costly = OneLineNoQ(), HintedNoRepeat(_no_repeat)
    return sampling_target(
        RICH_LM,
        [0],
        lambda t: cheap(t) and costly(t),
        lambda t: cheap.accepts_end(t) and costly.accepts_end(t),
        {RICH_EOS} | RICH_NEWLINES,
        max_tokens,
    )


def _exact_paths(model) -> tuple[dict, float]:
    exact = run(enumerate_exact(model))
    paths = weighted_paths(exact)
    z = sum(paths.values())
    return {p: w / z for p, w in paths.items()}, math.exp(exact.log_ml)


def _assert_same(found: tuple[dict, float], target: tuple[dict, float]) -> None:
    (paths, z), (want, z_want) = found, target
    assert z == pytest.approx(z_want, abs=1e-9)
    assert paths.keys() == want.keys()
    for p, w in want.items():
        assert paths[p] == pytest.approx(w, abs=1e-9), p


@pytest.mark.parametrize("proposal", ["sample", "mask", "lazy"])
def test_enumeration_of_every_proposal_is_the_sampling_target(proposal):
    target = _rich_target()
    model = HardConstraint(RICH_LM, [0], _rich_constraint(), proposal, 3, stop="newline")
    _assert_same(_exact_paths(model), target)
    newline_mass = sum(w for p, w in target[0].items() if p[-1] in RICH_NEWLINES)
    assert newline_mass > 0.2  # the newline ending is a large part of the target


class Counts:
    """How often the lazy draw's parts ran (wrappers installed with ``monkeypatch``)."""

    def __init__(self, monkeypatch) -> None:
        self.listed = self.hinted = self.cheap = 0
        exhaust, hints, mask = (
            token_check.TokenCheck.exhaust,
            constraint_formulations.allowed_hints,
            constraint_formulations.mask_round,
        )

        def counted_exhaust(check, budget):
            found, checks = exhaust(check, budget)
            self.listed += found is not None
            return found, checks

        def counted_hints(*args, **kw):
            out, checked = hints(*args, **kw)
            self.hinted += bool(out)
            return out, checked

        async def counted_mask(*args, **kw):
            self.cheap += 1
            return await mask(*args, **kw)

        monkeypatch.setattr(token_check.TokenCheck, "exhaust", counted_exhaust)
        monkeypatch.setattr(constraint_formulations, "allowed_hints", counted_hints)
        monkeypatch.setattr(constraint_formulations, "mask_round", counted_mask)


def test_the_lazy_draw_in_smc_is_unbiased_where_listing_hints_and_newlines_all_happen(
    monkeypatch,
):
    monkeypatch.setattr(lazy_proposal, "EXHAUST_AFTER", 1)
    counts = Counts(monkeypatch)
    target, z = _rich_target()
    model = HardConstraint(RICH_LM, [0], _rich_constraint(), max_tokens=3, stop="newline")
    assert model.proposal == "lazy"
    runs = [run(smc_standard(model, 4, seed=s)) for s in range(RUNS)]
    ended = [p for r in runs for p in r.particles if p.failure is None]
    by_newline = sum(path_of(p)[-1] in RICH_NEWLINES for p in ended)
    assert counts.listed >= 100, counts.listed  # draws that listed A on the trie
    assert counts.hinted >= 100, counts.hinted  # draws with an allowed hint
    assert counts.cheap >= 1000, counts.cheap  # draws masked by the cheap part
    assert by_newline >= 100, by_newline  # texts ended by a newline token
    assert_unbiased_paths(runs, target, z)


# ---------------------------------------------------------------- FLAT
FLAT_VOCAB = [chr(ord("a") + i) for i in range(26)] + ["ab", "ba", "ca", "<eos>"]
FLAT_EOS = len(FLAT_VOCAB) - 1
FLAT_LM = FunctionLM(
    FLAT_VOCAB,
    FLAT_EOS,
    lambda ctx: [0.2 * math.sin(i + len(ctx)) for i in range(FLAT_EOS)] + [len(ctx) - 2.0],
)


def _every_other(text: str) -> bool:
    """About half the letters are allowed, depending on the text's length."""
    return all((ord(ch) + i) % 2 == 0 for i, ch in enumerate(text))


def test_the_awrs_weight_is_unbiased_where_the_unseen_mass_is_large():
    target, z = sampling_target(FLAT_LM, [0], _every_other, _every_other, {FLAT_EOS}, 3)
    model = HardConstraint(FLAT_LM, [0], _every_other, max_tokens=3)
    runs = [run(smc_standard(model, 4, seed=s)) for s in range(RUNS)]
    assert_unbiased_paths(runs, target, z, bin_mass=0.1)


# ---------------------------------------------------------------- NOT_CLOSED
NC_VOCAB = ["x", "y", "xy", "z", "yx", "xz", "\n", "<eos>"]
NC_EOS = len(NC_VOCAB) - 1
NC_LM = FunctionLM(
    NC_VOCAB,
    NC_EOS,
    lambda ctx: (
        [math.sin(1.1 * i + 0.5 * len(ctx) + 0.3 * ctx[-1]) for i in range(NC_EOS)]
        + [0.3 * len(ctx) - 0.5]
    ),
)


def no_trailing_x(text: str) -> bool:
    """Rejects a text ending in "x" but accepts "xy": not closed under prefixes."""
    return not text.endswith("x") and len(text) <= 4


@pytest.mark.parametrize("proposal", ["sample", "mask", "lazy"])
def test_a_plain_callable_not_closed_under_prefixes_keeps_every_proposal_exact(proposal):
    target = sampling_target(NC_LM, [0], no_trailing_x, no_trailing_x, {NC_EOS}, 3)
    model = HardConstraint(NC_LM, [0], no_trailing_x, proposal, 3)
    _assert_same(_exact_paths(model), target)


def test_a_plain_callable_not_closed_under_prefixes_is_never_listed(monkeypatch):
    monkeypatch.setattr(lazy_proposal, "EXHAUST_AFTER", 1)
    counts = Counts(monkeypatch)
    target, z = sampling_target(NC_LM, [0], no_trailing_x, no_trailing_x, {NC_EOS}, 3)
    model = HardConstraint(NC_LM, [0], no_trailing_x, max_tokens=3)
    runs = [run(smc_standard(model, 4, seed=s)) for s in range(RUNS)]
    assert counts.listed == 0
    assert_unbiased_paths(runs, target, z)


class SoundNoX(PredicateConstraint):
    """A finished text holds no "x"; the prefix check rejects a text ending in "x" (sound: no
    completion of it passes) and accepts "xy" (not closed). It lists on the trie anyway
    (``text_check``), as COLLIE's word checks do."""

    def accepts_end(self, text: str) -> bool:
        return "x" not in text and len(text) <= 4

    def text_check(self, lm, state):
        return lambda x: self.checked(False, state + x)


@pytest.mark.parametrize("truncated", ["keep", "check"])
def test_a_sound_listing_is_not_used_where_cut_texts_skip_the_complete_check(truncated):
    """Under ``truncated="keep"`` a cut text faces only the prefix checks, so a listing that
    leaves out "xy" after "x" would change the target; under ``"check"`` it leaves out only
    dead tokens. Mask and lazy stay exact under both."""
    c = SoundNoX(no_trailing_x)
    target = sampling_target(NC_LM, [0], c, c.accepts_end, {NC_EOS}, 2, truncated)
    for proposal in ("mask", "lazy"):
        model = HardConstraint(NC_LM, [0], c, proposal, 2, truncated=truncated)
        _assert_same(_exact_paths(model), target)


class NewlineAfterB(Constraint):
    """After a "b" only a newline may follow (and then nothing): ``forced`` names it. Under
    ``stop="newline"`` that newline is an end token, so it must be drawn as an ending, not
    taken as text."""

    prefix_closed = True

    def __call__(self, text: str) -> bool:
        head, b, tail = text.partition("b")
        return "q" not in text and (not b or tail in ("", "\n")) and "\n" not in head

    def forced(self, lm, state):
        return 9 if state.endswith("b") else None  # "\n"


@pytest.mark.parametrize("proposal", ["mask", "lazy"])
def test_a_forced_end_token_ends_the_text(proposal):
    c = NewlineAfterB()
    target = sampling_target(RICH_LM, [0], c, c.accepts_end, {RICH_EOS} | RICH_NEWLINES, 3)
    model = HardConstraint(RICH_LM, [0], c, proposal, 3, stop="newline")
    _assert_same(_exact_paths(model), target)
