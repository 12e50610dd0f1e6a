"""How a constrained token is drawn (``llamppl.decoding.proposals``): the parts the
formulations of a hard constraint share.

- :mod:`~llamppl.decoding.proposals.lazy` — adaptive weighted rejection sampling: a lazy,
  exact token proposal that checks only the tokens it draws, with an unbiased weight;
- :mod:`~llamppl.decoding.proposals.token_check` — the lazy draw's check of one token (end
  tokens, the token budget, a time bound over one draw) and the listing of every allowed
  token after a long run of rejections;
- :mod:`~llamppl.decoding.proposals.vocab_trie` — the vocabulary as a radix trie, on which a
  check closed under prefixes lists its allowed tokens with few checks;
- :mod:`~llamppl.decoding.proposals.constrained_tokens` — the masked proposal and the lazy
  draw as distributions, batched across particles;
- :mod:`~llamppl.decoding.proposals.token_draw` — inverse-CDF draws of token ids, one per row.

Programs use them (``HardConstraint``'s formulations, ``models/constraint_formulations.py``)::

    from llamppl.decoding.proposals.lazy import lazy_draw
"""
