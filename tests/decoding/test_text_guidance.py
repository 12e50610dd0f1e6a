"""Guidance for text-structure constraints: hints and the target twist, exact all the same.

- ``hint`` names the token that writes what the constraint asks for next (a required word
  when it is due, the last sentence of a paragraph), and every hint is allowed;
- ``missing`` counts the targets the prefix has not yet certainly met (``target_twist``);
- with hints drawn and the twist applied, ``enumerate_exact`` still equals a brute-force
  sum and seeded importance-sampling and SMC runs stay unbiased (within 4 standard errors).
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("nltk")

from text_programs import LM, brute  # noqa: E402

from llamppl import run, using_rng  # noqa: E402
from llamppl.decoding.text.builders import (  # noqa: E402
    last_sentence_of_paragraphs,
    last_word_of_sentences,
    sentence_count,
    word_count,
    words_at,
)
from llamppl.inference import enumerate_exact, importance_sampling, smc_standard  # noqa: E402
from llamppl.models import HardConstraint  # noqa: E402


def test_hints_name_the_required_word_when_it_is_due(smollm):
    """``words_at``'s hint is the first token of the word due at the position being written
    (as given or lower-cased; the rest of it while it is being written), allowed by the
    constraint; none while another word is due or the words are not certain."""
    lm = smollm
    c = word_count(exactly=16) & words_at({3: "Frightful", 7: "immediate"})

    def hints(text):
        state = c.start(lm)
        for t in lm.encode(text) if text else []:
            state = c.advance(lm, state, t)
        found = c.hint(lm, state)
        assert all(c.allows(lm, state, h) for h in found)
        return {lm.vocab[h] for h in found}

    assert hints("The night was") == {
        lm.vocab[lm.encode(w)[0]] for w in (" Frightful", " frightful")
    }
    assert hints("The night was ") == {
        lm.vocab[lm.encode(w)[0]] for w in ("Frightful", "frightful")
    }
    assert hints("The night was fri") == {lm.vocab[lm.encode("ghtful")[0]]}
    assert hints("The night was frightful and") == set()  # word 5 is free
    assert hints("The night was frightful and it was") == {lm.vocab[lm.encode(" immediate")[0]]}
    assert hints("") == set() and hints("1) Nu-rugu poly-fer") == set()  # not due / not certain


def test_hints_copy_the_last_sentence_of_each_paragraph(smollm):
    """``last_sentence_of_paragraphs``'s hint starts the open paragraph's target sentence where
    a sentence may start once the paragraph holds its free sentences, continues a copy under
    way, then closes the paragraph (not after the last target); every hint is allowed."""
    lm = smollm
    c = last_sentence_of_paragraphs(["The cat sat on the mat.", "Dogs bark"], min_sentences=2)

    def hints(text):
        found = c.hint(lm, text)
        assert all(c.allows(lm, text, h) for h in found)
        return [lm.vocab[h] for h in found]

    first = "It rained. The cat sat on the mat."
    assert hints("") == [] and hints("It rai") == []  # no free sentence yet; mid-word
    assert hints("It rained.") == [" The"] and hints("It rained. ") == ["The"]
    assert hints("It rained. The c") == [lm.vocab[lm.encode("at sat")[0]]]
    assert hints(first) == [lm.vocab[lm.encode("\n\n")[0]]]
    assert hints("It rained. THE CAT") == [lm.vocab[lm.encode(" sat")[0]]]  # any case
    assert hints("It rained. The cat sat on the mat!") == hints(first)  # marks after a copy
    assert hints(first + "\n\nIt was late.") == [" Dogs"]
    assert hints(first + "\n\nIt was late. Dogs bark") == []  # the last target: no delimiter


def test_hinted_lazy_draws_keep_estimates_unbiased():
    """With hints drawn half the time, E[Ẑ π̂(s)] = Z π(s) for every string within 4 standard
    errors over 400 seeded importance-sampling runs (N = 4)."""
    import numpy as np

    constraint = word_count(exactly=2) & words_at({1: "ran"})
    target, z = brute(constraint, 4)
    model = HardConstraint(LM, [0], constraint, "lazy", 4, hint_prob=0.5)
    state = constraint.start(LM)
    assert constraint.hint(LM, constraint.advance(LM, state, 0)) == (1,)  # "He" -> " ran"
    runs = [run(importance_sampling(model, 4, seed=s)) for s in range(400)]
    z_hats = np.array([math.exp(r.log_ml) for r in runs])
    assert abs(z_hats.mean() - z) <= 4 * z_hats.std(ddof=1) / math.sqrt(len(runs))
    for key, w in target.items():
        est = np.array([math.exp(r.log_ml) * r.posterior.get(key, 0.0) for r in runs])
        se = max(est.std(ddof=1), math.sqrt(z * w)) / math.sqrt(len(runs))
        assert abs(est.mean() - z * w) <= 4 * se, (key, est.mean(), z * w)


def test_missing_counts_the_targets_not_yet_certainly_met():
    """``missing`` (``target_twist``'s measure) counts the targets whose unit is not yet
    certain (a word once a space follows it, a sentence once Punkt's break is final, a
    paragraph once closed); list targets and a count's floor alike; ``&`` sums the parts."""
    at = words_at({1: "ran", 3: "b"})
    texts = ["", "He ran", "He ran ", "He ran b b", "He ran b b "]
    assert [at.missing(LM, t) for t in texts] == [2, 2, 1, 1, 0]
    # a required last sentence counts its words; a copy under way after the paragraph's free
    # sentence is credited word by word (as each word begins), in any case, marks after it
    ends = last_sentence_of_paragraphs(["The cat sat", "Dogs bark"], min_sentences=2)
    first = "It rained. The cat sat."
    texts = ["", "The cat sat", "It rained. The c", "It rained. THE CAT SAT", first]
    assert [ends.missing(LM, t) for t in texts] == [5, 5, 3, 2, 2]
    late = first + "\n\nIt was late. "
    texts = [first + "\n\n", late + "Do", late + "Dogs bark.", "It rained, The c"]
    assert [ends.missing(LM, t) for t in texts] == [2, 1, 0, 5]
    smith = last_sentence_of_paragraphs(["Smith ran"], min_sentences=2)
    assert smith.missing(LM, "Ask Mr. Smith r") == 2  # Punkt: no break after "Mr."
    assert smith.missing(LM, "Ask him. Smith r") == 0
    assert ends.missing(LM, "It rained. The cat sat. It rained") == 5  # the copy broke
    last = last_word_of_sentences(["ran", "b"])
    assert [last.missing(LM, t) for t in ["He ran.", "He ran. He", "He ran. He b."]] == [2, 1, 1]
    assert last_word_of_sentences("ran").missing(LM, "He ran. He") == 0  # one target for all
    three = sentence_count(at_least=3)  # a count's floor: each certain unit short of it
    texts = ["", "He ran. He", "He ran. It ran. We ran.", "He ran. It ran. We ran. They"]
    assert [three.missing(LM, t) for t in texts] == [3, 2, 1, 0]
    assert word_count(at_least=5).missing(LM, "He ran b ") == 0  # words name no targets
    both = word_count(exactly=4) & words_at({1: "ran", 2: "b"})
    state = both.start(LM)
    for t in (0, 1, 5):  # "He ran b"
        state = both.advance(LM, state, t)
    assert both.missing(LM, state) == 1


def test_the_target_twist_leaves_posterior_and_z_exact_and_favours_met_targets():
    """log ψ(s) = −target_twist · missing(s) on live particles, undone at the end: enumeration
    is exact, a live particle that wrote its target carries the refund, and over 300 seeded
    SMC runs (resampling on twisted weights) Ẑ is unbiased within 4 standard errors."""
    import numpy as np

    constraint = word_count(exactly=2) & words_at({0: "He"})
    target, z = brute(constraint, 4)
    model = HardConstraint(LM, [0], constraint, "lazy", 4, target_twist=3.0)
    exact = run(enumerate_exact(model))
    assert exact.log_ml == pytest.approx(math.log(z), abs=1e-10)
    for key, w in target.items():
        assert exact.posterior[key] == pytest.approx(w, abs=1e-10)
    seen = set()
    for seed in range(20):  # no other twist, "sample": a live weight is −3 · missing
        m = HardConstraint(
            LM, [0], constraint, "sample", 4, end_twist=0, need_twist=0, target_twist=3.0
        )
        with using_rng(np.random.default_rng(seed)):
            run(m.advance())
            run(m.advance())
        if not m.finished and m.weight > -math.inf:
            missed = constraint.missing(LM, m.state)
            seen.add(missed)
            assert m.weight == pytest.approx(-3.0 * missed, abs=1e-12)
    assert seen == {0, 1}  # texts that met the target and texts that had not yet
    runs = [run(smc_standard(model, 4, seed=s)) for s in range(300)]
    z_hats = np.array([math.exp(r.log_ml) for r in runs])
    assert abs(z_hats.mean() - z) <= 4 * z_hats.std(ddof=1) / math.sqrt(len(runs))
