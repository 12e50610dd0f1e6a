"""Token tables of a Hugging Face tokenizer: exact text and bytes of every id, EOS and BOS ids.

``CachedCausalLM`` needs ``vocab[i]`` (the text token ``i`` appends) for every id,
built once and fast. Byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM) and SentencePiece
vocabularies with byte fallback (Llama 2, Mistral, Gemma: ``▁`` for spaces,
``<0x0A>`` byte tokens) are mapped exactly from their pieces; any other tokenizer
falls back to decoding each id on its own::

    vocab, byte_vocab, join_bytes = build_vocab(tokenizer, model.config.vocab_size)

Conventions (what constraints see):

- ``byte_vocab[i]`` is the exact bytes token ``i`` appends to a non-empty context
  (``b" the"`` for ``Ġthe`` or ``▁the``, ``b"\n"`` for ``<0x0A>``, ``b"\xc3"`` for
  a byte that begins ``é``). Special and added tokens give their UTF-8 text.
- ``vocab[i]`` is ``byte_vocab[i]`` decoded as UTF-8. A token that holds only part
  of a multi-byte character (``<0xC3>``, GPT-2's ``Ã``) cannot be shown alone and is
  ``"\ufffd"`` there; to read text across such tokens, join ``byte_vocab`` entries
  first and decode once (``b"\xc3" + b"\xa9"`` → ``"é"``).
- SentencePiece decoders drop the one leading space of a whole sequence
  (``▁Paris`` alone decodes to ``"Paris"``); ``vocab`` keeps it, since after a
  prompt the space is really there. ``join_bytes`` tells whether
  ``b"".join(byte_vocab[i] for i in ids).decode("utf-8", "replace")`` equals the
  tokenizer's own decode (byte-level BPE: yes); otherwise decode with the tokenizer.

:class:`HFTokenizerLM` is the tokenizer half both Hugging Face tokenizer backends
(:class:`~llamppl.CachedCausalLM`, :class:`~llamppl.lm.vllm.lm.VLLMLM`) share: these
tables, ``encode``/``decode``, the chat template and the next-token log-prob LRU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..validation import check_nonnegative_int
from .base import LanguageModel, validate_token_ids
from .memo import LRU

__all__ = ["HFTokenizerLM", "build_vocab", "eos_ids", "bos_id"]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte <-> printable-unicode table."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _decoder_kind(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    dec = getattr(backend, "decoder", None)
    name = type(dec).__name__ if dec is not None else ""
    if name == "ByteLevel":
        return "byte_level"
    if dec is not None and "ByteFallback" in repr(dec) and "▁" in repr(dec):
        return "sentencepiece"
    return "other"


def build_vocab(tokenizer: Any, size: int) -> tuple[list[str], list[bytes], bool]:
    """``(vocab, byte_vocab, join_bytes)``: text and exact bytes of every token id (ids past
    the tokenizer get ``""``), and whether joining bytes reproduces the tokenizer's decode
    (module docstring)."""
    n = min(size, len(tokenizer))
    pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = {i for i in range(n) if i in special}
    added |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    kind = _decoder_kind(tokenizer)
    out_bytes: list[bytes] = []
    if kind == "byte_level":
        table = {c: b for b, c in _bytes_to_unicode().items()}
        for i, piece in enumerate(pieces):
            if piece is None:
                out_bytes.append(b"")
            elif i in added or any(ch not in table for ch in piece):
                out_bytes.append(piece.encode("utf-8"))
            else:
                out_bytes.append(bytes(table[ch] for ch in piece))
        join_bytes = True
    elif kind == "sentencepiece":
        for i, piece in enumerate(pieces):
            if piece is None:
                out_bytes.append(b"")
            elif (
                i not in added
                and len(piece) == 6
                and piece.startswith("<0x")
                and piece.endswith(">")
            ):
                out_bytes.append(bytes([int(piece[3:5], 16)]))
            elif i in added:
                out_bytes.append(piece.encode("utf-8"))
            else:
                out_bytes.append(piece.replace("▁", " ").encode("utf-8"))
        join_bytes = False  # the decoder strips a leading space and fuses byte runs itself
    else:
        texts = tokenizer.batch_decode([[i] for i in range(n)], clean_up_tokenization_spaces=False)
        out_bytes = [t.encode("utf-8") for t in texts]
        join_bytes = False
    out_bytes += [b""] * (size - n)
    vocab = [b.decode("utf-8", errors="replace") for b in out_bytes]
    return vocab, out_bytes, join_bytes


def _ids(value: Any) -> list[int]:
    """An id or a list of ids from a config field, as a list (``None`` gives ``[]``)."""
    if value is None:
        return []
    if isinstance(value, (list, tuple, set, frozenset)):
        return [int(v) for v in value if v is not None]
    return [int(value)]


def eos_ids(tokenizer: Any, model: Any, size: int) -> tuple[int, frozenset[int]]:
    """``(primary EOS id, every id that ends a sequence)``.

    The primary id is the tokenizer's ``eos_token_id`` (else the first id the
    generation config, then the model config, lists). The set adds every id in
    ``model.generation_config.eos_token_id`` and ``model.config.eos_token_id``
    (an int or a list: chat models end a turn with e.g. ``<|im_end|>`` or
    ``<|eot_id|>`` as well as ``<|end_of_text|>``). Ids outside ``[0, size)`` are dropped.
    """
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    cfg = getattr(getattr(model, "config", None), "eos_token_id", None)
    candidates = _ids(getattr(tokenizer, "eos_token_id", None)) + _ids(gen) + _ids(cfg)
    valid = [i for i in candidates if 0 <= i < size]
    if not valid:
        raise ValueError(
            f"could not find a valid eos_token_id (tokenizer, generation config and model config "
            f"give {candidates!r}) for a vocabulary of {size}"
        )
    return valid[0], frozenset(valid)


def bos_id(tokenizer: Any) -> int | None:
    """The BOS id if the tokenizer adds one by default, else None."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    try:
        ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    except Exception:
        return None
    return int(bos) if ids and ids[0] == bos else None


class HFTokenizerLM(LanguageModel):
    """A :class:`LanguageModel` whose token ids are those of a Hugging Face tokenizer.

    Parameters
    ----------
    tokenizer : transformers tokenizer
        The tokenizer.
    vocab_size : int
        Width of the log-prob vectors (the model's output dimension; may exceed the tokenizer).
    model : object
        Where :func:`eos_ids` reads ``config`` and ``generation_config`` EOS ids.
    max_cached_logprobs : int
        How many next-token log-prob vectors :attr:`logprob_memo` keeps (most recent).

    Attributes
    ----------
    tokenizer
        The tokenizer.
    vocab_bytes : list[bytes]
        Exact bytes of every token id (module docstring).
    logprob_memo : LRU
        Recent next-token log-prob vectors, keyed as the backend chooses.
    """

    def __init__(
        self, tokenizer: Any, vocab_size: int, model: Any, max_cached_logprobs: int
    ) -> None:
        super().__init__()
        capacity = check_nonnegative_int("max_cached_logprobs", max_cached_logprobs)
        self.tokenizer = tokenizer
        self._vocab_size = vocab_size
        self.vocab, self.vocab_bytes, self._join_bytes = build_vocab(tokenizer, vocab_size)
        self.eos_token_id, eos_set = eos_ids(tokenizer, model, vocab_size)
        self.other_eos_token_ids = eos_set - {self.eos_token_id}
        self.bos_token_id = bos_id(tokenizer)
        self.logprob_memo: LRU[Any, torch.Tensor] = LRU(capacity)

    @property
    def vocab_size(self) -> int:
        """Output dimension of the model (may exceed the tokenizer's length)."""
        return self._vocab_size

    @property
    def max_cached_logprobs(self) -> int:
        """How many next-token log-prob vectors are kept (most recent first)."""
        return self.logprob_memo.capacity

    @max_cached_logprobs.setter
    def max_cached_logprobs(self, value: int) -> None:
        self.logprob_memo.capacity = check_nonnegative_int("max_cached_logprobs", value)

    @property
    def byte_vocab(self) -> list[bytes]:
        """Exact bytes each token id appends (``vocab_bytes``; see the module docstring)."""
        return self.vocab_bytes

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, no special tokens added."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` (special tokens included as their text)."""
        ids = validate_token_ids(token_ids, self.vocab_size)
        if self._join_bytes:  # byte-level BPE: the bytes are the decode
            return b"".join(self.vocab_bytes[i] for i in ids).decode("utf-8", errors="replace")
        return self.tokenizer.decode(list(ids), clean_up_tokenization_spaces=False)

    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        """Token ids of ``messages`` rendered by the tokenizer's chat template with the
        generation prompt (the text up to where the assistant's reply begins).

        Raises ``ValueError`` if the tokenizer has no chat template (a base model).
        """
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                f"the tokenizer of {type(self).__name__} has no chat template "
                "(a base model?): pass a prompt string instead of messages"
            )
        text = self.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=False
        )
        # The template writes BOS and role markers itself: add no special tokens again.
        return list(self.tokenizer.encode(text, add_special_tokens=False))
