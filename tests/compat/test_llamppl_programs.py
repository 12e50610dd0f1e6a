"""LLaMPPL programs, written in LLaMPPL's form, run here with only the model-loading line changed.

Each program follows a published LLaMPPL example (README, paper §3, the peer's
``examples/``), rewritten for these tests: in LLaMPPL the model is loaded with
``CachedCausalLM.from_pretrained("meta-llama/...")``; here it is the embedded
model (the ``smollm`` fixture, i.e. ``CachedCausalLM.default()``). Everything
else — imports from ``llamppl``, ``asyncio.run(smc_steer(...))``, iterating
particles with ``.weight`` — is the LLaMPPL form, plus ``seed=0`` so that the tests are
reproducible. N and lengths are small (2-core CI).
"""

from __future__ import annotations

import asyncio
import math

from llamppl import LMContext, Model, sample_word, smc_standard, smc_steer


def well_formed(particles, n):
    particles = list(particles)  # LLaMPPL: an iterable of particles with .weight
    assert len(particles) == n
    assert all(not math.isnan(p.weight) for p in particles)
    assert any(p.weight > -math.inf for p in particles)
    return [p for p in particles if p.weight > -math.inf]


class NoLetterE(Model):  # README example: forbid a letter by masking tokens that contain it
    def __init__(self, lm, prompt, forbidden_letter, max_tokens=6):
        super().__init__()
        self.context = LMContext(lm, prompt)
        self.eos_token = lm.tokenizer.eos_token_id
        self.forbidden_tokens = {i for i, v in enumerate(lm.vocab) if forbidden_letter in v}
        self.max_tokens = max_tokens

    async def step(self):
        await self.observe(self.context.mask_dist(self.forbidden_tokens), False)
        token = await self.sample(self.context.next_token())
        if token == self.eos_token or self.context.token_count >= self.max_tokens:
            self.finish()


def test_readme_example(smollm):
    particles = asyncio.run(smc_steer(NoLetterE(smollm, "The weather today is", "e"), 2, 2, seed=0))
    for p in well_formed(particles, 2):
        assert "e" not in str(p.context)


class ShortWords(Model):  # paper §3 hard constraints: every word at most 5 letters
    def __init__(self, lm, prompt, max_words=3):
        super().__init__()
        self.context = LMContext(lm, prompt)
        self.max_words, self.words = max_words, []

    async def step(self):
        word, punctuation = await self.call(sample_word(self.context, max_tokens=3))
        self.condition(len(word.strip()) <= 5)
        self.words.append(word.strip())
        if len(self.words) == self.max_words:
            self.finish()


def test_hard_constraint_word_level(smollm):
    particles = asyncio.run(
        smc_standard(
            ShortWords(smollm, "My favourite animal is", max_words=2),
            8,
            resampling_method="multinomial",
            seed=0,
        )
    )
    for p in well_formed(particles, 8):
        assert len(p.words) == 2 and all(1 <= len(w) <= 5 and w.isalpha() for w in p.words)


class Haiku(Model):  # word-level generation: a fixed number of words per line
    def __init__(self, lm, prompt, words_per_line=(2, 2)):
        super().__init__()
        self.context = LMContext(lm, prompt, show_prompt=False)
        self.lines, self.words_per_line = [[]], list(words_per_line)

    async def step(self):
        word, _ = await self.call(sample_word(self.context, allow_punctuation=False))
        self.lines[-1].append(word.strip())
        if len(self.lines[-1]) == self.words_per_line[len(self.lines) - 1]:
            if len(self.lines) == len(self.words_per_line):
                self.finish()
                return
            await self.observe(self.context.next_token(), self.context.lm.encode("\n")[0])
            self.lines.append([])


def test_haiku_word_level(smollm):
    particles = asyncio.run(smc_steer(Haiku(smollm, "A haiku about the sea:\n"), 2, 2, seed=0))
    for p in well_formed(particles, 2):
        assert [len(line) for line in p.lines] == [2, 2]
        assert str(p.context).count("\n") == 1


class Infilling(Model):  # paper §3: generate between fixed fragments, observing each fragment
    def __init__(self, lm, fragments, tokens_between=2):
        super().__init__()
        self.context = LMContext(lm, fragments[0])
        self.remaining = [lm.encode(f) for f in fragments[1:]]
        self.tokens_between = tokens_between

    async def step(self):
        for _ in range(self.tokens_between):
            await self.sample(self.context.next_token())
        for token in self.remaining.pop(0):
            await self.observe(self.context.next_token(), token)
        if not self.remaining:
            self.finish()


def test_infilling(smollm):
    particles = asyncio.run(
        smc_steer(Infilling(smollm, ["The cat", " sat on the", " mat."]), 2, 2, seed=0)
    )
    for p in well_formed(particles, 2):
        assert str(p.context).endswith(" mat.") and " sat on the" in str(p.context)


class PromptIntersection(Model):  # paper §3: sample from one prompt, score under all of them
    def __init__(self, lm, prompts, max_tokens=3):
        super().__init__()
        self.contexts = [LMContext(lm, p) for p in prompts]
        self.max_tokens = max_tokens

    async def step(self):
        token = await self.sample(self.contexts[0].next_token())
        for context in self.contexts[1:]:
            await self.observe(context.next_token(), token)
        if self.contexts[0].token_count == self.max_tokens:
            self.finish()

    def string_for_serialization(self):
        return str(self.contexts[0])


def test_prompt_intersection(smollm):
    prompts = ["My favourite physicist is", "My favourite writer is"]
    particles = asyncio.run(smc_steer(PromptIntersection(smollm, prompts), 2, 2, seed=0))
    for p in well_formed(particles, 2):
        texts = {str(c) for c in p.contexts}
        assert len(texts) == 1 and p.contexts[0].token_count == 3
