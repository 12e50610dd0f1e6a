"""The token table of ``CachedCausalLM`` on tokenizers built here from the ``tokenizers`` library.

Two tiny tokenizers are trained in memory (no download): a byte-level BPE (GPT-2 /
Llama 3 / Qwen style) and a SentencePiece-style Unigram with byte fallback and a
Metaspace pre-tokenizer (Llama 2 / Mistral style: ``▁`` spaces, ``<0x0A>`` byte
tokens), each with special and added tokens, wrapped in ``PreTrainedTokenizerFast``
and put behind a tiny random-weight Llama. Checked: ``lm.decode`` equals the
tokenizer's own decode for any id sequence; ``vocab[i]`` is the text token ``i``
appends to a context; ``byte_vocab`` concatenates to the exact bytes.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from llamppl import LMContext
from llamppl.lm.hf.cached_causal_lm import CachedCausalLM

CORPUS = [
    "The cat sat on the mat.\nThe dog ate the bone!",
    "Über naïve café — 東京 🙂 costs €5, said the cat.",
    "def f(x):\n    return x  # tabs\tand  spaces",
] * 3
PREFIX_TEXT = "The cat"


def _byte_level() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    out.add_tokens(["<tool>"])  # an added, non-special token
    return out


SP_DECODERS = {  # as transformers builds them: Llama 2 / Mistral; Gemma
    "sp_llama2": [
        decoders.Replace("▁", " "),
        decoders.ByteFallback(),
        decoders.Fuse(),
        decoders.Strip(" ", 1, 0),
    ],
    "sp_gemma": [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()],
}


def _sentencepiece(decoder: str) -> PreTrainedTokenizerFast:
    trained = Tokenizer(models.Unigram())
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.UnigramTrainer(
        vocab_size=120,
        special_tokens=["<unk>", "<s>", "</s>"],
        unk_token="<unk>",
        show_progress=False,
    )
    trained.train_from_iterator(CORPUS, trainer)
    pieces = [tuple(p) for p in json.loads(trained.to_str())["model"]["vocab"]]
    # Keep printable ASCII pieces only: newlines, accents, CJK and emoji go through the
    # <0xXX> byte tokens, as in Llama 2's tokenizer.
    learned = [p for p in pieces[3:] if all(" " <= c <= "~" or c == "▁" for c in p[0])]
    byte_pieces = [(f"<0x{b:02X}>", 0.0) for b in range(256)]
    tok = Tokenizer(
        models.Unigram(pieces[:3] + byte_pieces + learned, unk_id=0, byte_fallback=True)
    )
    tok.pre_tokenizer = trained.pre_tokenizer
    tok.decoder = decoders.Sequence(SP_DECODERS[decoder])
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    out.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    out.add_tokens(["<tool>"])
    return out


def _tiny_lm(tokenizer: PreTrainedTokenizerFast) -> CachedCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        attn_implementation="sdpa",
    )
    return CachedCausalLM(LlamaForCausalLM(config), tokenizer, max_cache_tokens=64)


LMS = {"byte_level": _tiny_lm(_byte_level())} | {
    name: _tiny_lm(_sentencepiece(name)) for name in SP_DECODERS
}
KINDS = sorted(LMS)


def _hf_decode(lm: CachedCausalLM, ids: list[int]) -> str:
    return lm.tokenizer.decode(ids, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("kind", KINDS)
def test_table_is_exact_and_covers_special_and_byte_tokens(kind):
    lm = LMS[kind]
    tok = lm.tokenizer
    assert lm._join_bytes == (kind == "byte_level") and len(lm.vocab) == len(tok)
    assert lm.byte_vocab is lm.vocab_bytes and len(lm.byte_vocab) == lm.vocab_size
    for name in tok.all_special_tokens + ["<tool>"]:  # special and added tokens: their text
        i = tok.convert_tokens_to_ids(name)
        assert lm.vocab[i] == name and lm.byte_vocab[i] == name.encode()
    assert lm.vocab[lm.eos_token_id] == tok.eos_token
    if kind.startswith("sp_"):
        assert lm.byte_vocab[tok.convert_tokens_to_ids("<0x0A>")] == b"\n"
        assert lm.byte_vocab[tok.convert_tokens_to_ids("<0xC3>")] == b"\xc3"
        assert lm.vocab[tok.convert_tokens_to_ids("<0xC3>")] == "\ufffd"  # partial UTF-8
        word = next(p for p in sorted(tok.get_vocab()) if p.startswith("▁") and len(p) > 1)
        assert lm.vocab[tok.convert_tokens_to_ids(word)] == " " + word[1:]
    else:
        assert lm.byte_vocab[tok.convert_tokens_to_ids("Ċ")] == b"\n"
        assert lm.byte_vocab[tok.convert_tokens_to_ids("Ã")] == b"\xc3"
        word = next(p for p in sorted(tok.get_vocab()) if p.startswith("Ġ") and len(p) > 1)
        assert lm.vocab[tok.convert_tokens_to_ids(word)] == " " + word[1:]


@pytest.mark.parametrize("kind", KINDS)
def test_vocab_entry_is_the_text_each_token_appends(kind):
    lm = LMS[kind]
    prefix = lm.encode(PREFIX_TEXT)
    base = _hf_decode(lm, prefix)
    partial = 0
    for i in range(lm.vocab_size):
        try:
            lm.byte_vocab[i].decode("utf-8")
        except UnicodeDecodeError:  # an incomplete character: shown as U+FFFD (see hf_vocab)
            partial += 1
            assert lm.vocab[i] == lm.byte_vocab[i].decode("utf-8", errors="replace")
            continue
        assert _hf_decode(lm, prefix + [i]) == base + lm.vocab[i], (i, lm.vocab[i])
    assert partial > 0  # both tokenizers have tokens that are part of a character


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_decode_equals_the_tokenizers_decode(kind, data):
    lm = LMS[kind]
    ids = data.draw(st.lists(st.integers(0, lm.vocab_size - 1), max_size=12))
    assert lm.decode(ids) == _hf_decode(lm, ids)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20))
def test_byte_vocab_concatenates_to_the_appended_text(kind, text):
    # Multi-byte characters split over several tokens (é = <0xC3><0xA9>) come out whole.
    lm = LMS[kind]
    prefix, ids = lm.encode(PREFIX_TEXT), lm.encode(" " + text)
    appended = b"".join(lm.byte_vocab[i] for i in ids).decode("utf-8")
    assert _hf_decode(lm, prefix + ids) == _hf_decode(lm, prefix) + appended
    assert lm.decode(ids) == _hf_decode(lm, ids)


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_chat_template_and_generation_config_end_tokens():
    tok = _byte_level()
    messages = [{"role": "user", "content": "The cat?"}]
    with pytest.raises(ValueError, match="no chat template"):
        LMContext(_tiny_lm(tok), messages=messages)
    tok.chat_template = CHATML
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    model = _tiny_lm(tok).model
    model.generation_config.eos_token_id = [tok.eos_token_id, im_end]  # as chat models list them
    lm = CachedCausalLM(model, tok, max_cache_tokens=64)
    assert lm.eos_token_id == tok.eos_token_id and lm.eos_token_ids == {tok.eos_token_id, im_end}
    ctx = LMContext(lm, messages=messages)
    assert ctx.prompt == "<|im_start|>user\nThe cat?<|im_end|>\n<|im_start|>assistant\n"
    assert ctx.tokens[0] == tok.convert_tokens_to_ids("<|im_start|>")  # a special token, not text
    ctx.extend(lm.encode(" the")[0])
    assert not ctx.finished
    ctx.extend(im_end)
    assert ctx.finished
