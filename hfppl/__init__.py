"""``hfppl``: LLaMPPL's earlier name, kept so programs written for it run unchanged.

Every name and module path is this distribution's ``llamppl`` under the old name,
the very same objects (``hfppl.Model is llamppl.Model``)::

    from hfppl import CachedCausalLM, LMContext, Model, smc_standard
    from hfppl.distributions.lmcontext import LMContext
    from hfppl.llms import CachedCausalLM

``import hfppl.X.Y`` returns the module ``llamppl.X.Y`` itself: a finder on
``sys.meta_path`` maps the ``hfppl.`` prefix to ``llamppl.``, so there is no
second copy of any class or module state.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

import llamppl

__all__ = list(llamppl.__all__)
__version__ = llamppl.__version__
_PREFIX, _TARGET = "hfppl.", "llamppl."


class _AliasLoader(importlib.abc.Loader):
    """Loads ``hfppl.X`` as the already importable module ``llamppl.X``."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self.real_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the alias spec on the shared module; give it back its own.
        module.__spec__ = self.real_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Resolves ``hfppl.<path>`` to ``llamppl.<path>`` (and nothing else)."""

    def find_spec(self, fullname: str, path=None, target=None):
        if not fullname.startswith(_PREFIX):
            return None
        real = _TARGET + fullname[len(_PREFIX) :]
        if importlib.util.find_spec(real) is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real))


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())


def __getattr__(name: str):
    """Every public name of ``llamppl`` (the inference names lazily, as there)."""
    try:
        return getattr(llamppl, name)
    except AttributeError:
        raise AttributeError(f"module 'hfppl' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(globals()))
