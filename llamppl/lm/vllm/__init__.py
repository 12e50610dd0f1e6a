"""The vLLM backend: :class:`VLLMLM`, a :class:`~llamppl.lm.base.LanguageModel` served by a vLLM engine.

Its parts: the LM itself (:mod:`.lm`), building the engine (:mod:`.load`), the live mode's
round planning and request bookkeeping (:mod:`.engine`), the adapter over vLLM's engine
core and the log-prob capture (:mod:`.port`), and the KV connector that lets a resampled
particle's request continue from its ancestor's cache (:mod:`.fork`). vLLM itself is
imported only when an engine is built::

    from llamppl.lm.vllm import VLLMLM
    lm = VLLMLM.from_pretrained("/models/Llama-3.1-8B-Instruct", tensor_parallel_size=2)
"""

from .engine import VLLMStats
from .lm import VLLMLM

__all__ = ["VLLMLM", "VLLMStats"]
