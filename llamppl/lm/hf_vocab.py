"""Token tables of a Hugging Face tokenizer: exact text and bytes of every id, EOS and BOS ids.

``CachedCausalLM`` needs ``vocab[i]`` (the text token ``i`` appends) for every id,
built once and fast. Byte-level BPE (GPT-2, LLaMA-3, SmolLM) and SentencePiece
vocabularies are mapped exactly from their pieces; any other tokenizer falls back
to decoding each id on its own::

    vocab, vocab_bytes, exact = build_vocab(tokenizer, model.config.vocab_size)
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_vocab", "eos_ids", "bos_id"]


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
    """Text and exact bytes of every token id; ids past the tokenizer get ``""``."""
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
        exact = True
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
        exact = True
    else:
        texts = tokenizer.batch_decode([[i] for i in range(n)], clean_up_tokenization_spaces=False)
        out_bytes = [t.encode("utf-8") for t in texts]
        exact = False
    out_bytes += [b""] * (size - n)
    vocab = [b.decode("utf-8", errors="replace") for b in out_bytes]
    return vocab, out_bytes, exact


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
