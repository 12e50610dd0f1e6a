"""``GrammarLogitsProcessor``: local grammar masking for plain HF ``generate`` — the BIASED baseline.

At each step it sets the logits of the tokens the grammar forbids to ``-inf``
(EOS allowed exactly when the matcher accepts), for the whole batch at once: one
llguidance call fills the bitmask, one tensor operation applies it. Every output
is valid, but the sampled distribution is

    q(y) = ∏_t p(y_t | y_<t) 1_C(y_≤t) / G'_t(y_<t),

not the conditional p(y | y ∈ L) ∝ p(y) 1_L(y): each token ignores how much valid
probability mass lies ahead (the missing factor is ∏_t G'_t, the potential that
:class:`~llamppl.models.GrammarConstraint` keeps and SMC corrects for). Use it to
compare, or when speed matters more than fidelity::

    from llamppl import CachedCausalLM
    from llamppl.decoding.grammar.logits import GrammarLogitsProcessor
    lm = CachedCausalLM.default()
    ids = lm.tokenizer("Answer: ", return_tensors="pt").input_ids
    proc = GrammarLogitsProcessor(lm, regex=r"(yes|no)\\.")
    out = lm.model.generate(ids, logits_processor=[proc], do_sample=True, max_new_tokens=5)
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessor

from llamppl.decoding.grammar.engine import Grammar, MatcherState, allowed_masks, make_grammar
from llamppl.lm.base import LanguageModel

__all__ = ["GrammarLogitsProcessor"]


class GrammarLogitsProcessor(LogitsProcessor):
    """HF ``LogitsProcessor`` masking each row of a batch to its grammar-allowed tokens.

    Parameters
    ----------
    lm : LanguageModel
        Gives the tokenizer and EOS (a :class:`~llamppl.CachedCausalLM`).
    grammar, json_schema, regex, lark
        Exactly one, as for :class:`~llamppl.models.GrammarConstraint`.

    Notes
    -----
    One processor serves one ``generate`` call (it remembers the prompt length and
    the rows' matchers); make a new one per call.
    """

    def __init__(
        self,
        lm: LanguageModel,
        grammar: Grammar | None = None,
        *,
        json_schema: Any = None,
        regex: str | None = None,
        lark: str | None = None,
    ) -> None:
        self.lm = lm
        self.grammar = make_grammar(grammar, json_schema=json_schema, regex=regex, lark=lark)
        self.states: list[MatcherState] | None = None
        self.done: list[bool] = []
        self._prompt_length = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        B = input_ids.shape[0]
        if self.states is None:
            self.states = [MatcherState(self.lm, self.grammar) for _ in range(B)]
            self.done = [False] * B
            self._prompt_length = input_ids.shape[1]
        elif input_ids.shape[1] > self._prompt_length:
            last = input_ids[:, -1].tolist()
            for i, t in enumerate(last):
                if self.done[i]:
                    continue
                if t == self.lm.eos_token_id:
                    self.done[i] = True
                else:
                    self.states[i].consume(t)
        masks = allowed_masks(self.lm, self.states).to(scores.device)  # (B, V) bool
        if any(self.done):  # finished rows: only EOS, so softmax stays finite
            rows = torch.tensor(self.done, device=scores.device)
            masks[rows] = False
            masks[rows, self.lm.eos_token_id] = True
        V = masks.shape[1]
        out = scores.clone()
        out[:, :V] = scores[:, :V].masked_fill(~masks, float("-inf"))  # one op for the batch
        out[:, V:] = float("-inf")
        return out
