"""Language models over bytes built from token LMs: the covering and its beam
(:mod:`.covering`), :class:`ByteLM` (:mod:`.byte_lm`), token healing of prompts
(:mod:`.healing`) and canonical tokenizations (:mod:`.canonical`). See ``docs/bytes.md``."""

from .byte_lm import ByteLM, ByteLMStats, document_start
from .covering import EOS_BYTE, Covering, Element, extend_covering, next_byte_logprobs

__all__ = [
    "ByteLM",
    "ByteLMStats",
    "Covering",
    "EOS_BYTE",
    "document_start",
    "Element",
    "extend_covering",
    "next_byte_logprobs",
]
