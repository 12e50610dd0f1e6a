"""Names a package exports but imports on first use (PEP 562), for the parts that load ``transformers``.

``import transformers`` costs about half a second and the Hugging Face backend it feeds
(``llamppl.lm.hf``: cache utilities, attention and masking interfaces, which pull in
``torch.distributed`` and ``sympy``) two more; programs on a :class:`~llamppl.FunctionLM`
or a vLLM engine never need them. A package lists such names with :func:`lazy_exports`;
each is imported when first looked up and then kept in the package's namespace, so
``from llamppl import CachedCausalLM``, ``__all__``, ``dir()`` and star imports are as if it
had been imported eagerly. The same names are imported under ``TYPE_CHECKING`` for type
checkers and the docs (griffe reads them statically)::

    from typing import TYPE_CHECKING
    from llamppl.lazy_exports import lazy_exports

    if TYPE_CHECKING:
        from .hf.cached_causal_lm import CachedCausalLM
    __getattr__, __dir__ = lazy_exports(
        globals(), {"CachedCausalLM": "llamppl.lm.hf.cached_causal_lm:CachedCausalLM"}
    )
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    namespace: dict[str, Any], sources: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` that serve ``sources`` in ``namespace``.

    Parameters
    ----------
    namespace : dict
        The package's ``globals()``; a looked-up name is stored there (imported once).
    sources : dict[str, str]
        Exported name -> ``"module:attribute"`` it is imported from.
    """
    module_name = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        module, _, attribute = source.partition(":")
        value = getattr(importlib.import_module(module), attribute)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *sources})

    return __getattr__, __dir__
