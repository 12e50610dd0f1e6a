"""llamppl: probabilistic programming with language models, steered by sequential Monte Carlo.

Write a :class:`Model` subclass whose ``step`` uses ``sample`` / ``observe`` /
``condition`` / ``twist``, then run an algorithm from :mod:`llamppl.inference`::

    from llamppl import Model, LMContext, CachedCausalLM, run
    from llamppl.inference import smc_steer
    lm = CachedCausalLM.default()
    result = run(smc_steer(MyModel(lm, "The Fed says"), n_particles=8, n_beam=3, seed=0))
"""

import warnings as _warnings
from typing import TYPE_CHECKING as _TYPE_CHECKING

# transformers imports tqdm.auto, which in Jupyter without ipywidgets warns "IProgress not
# found" and then uses the plain text bar anyway: import it first, without the warning
with _warnings.catch_warnings():
    _warnings.filterwarnings("ignore", message="IProgress not found")
    import tqdm.auto as _tqdm_auto  # noqa: F401

from . import lazy_exports
from .chunks import sample_word, sample_word_2
from .context import LMContext, LMNextToken, LMTokenMask
from .distributions import (
    Bernoulli,
    Categorical,
    Dirac,
    Distribution,
    Geometric,
    TokenCategorical,
    Transformer,
    Uniform,
)
from .lm import VLLMLM, ByteLM, FunctionLM, LanguageModel
from .modeling import Model
from .rng import current_rng, using_rng
from .runner import run
from .submodel import SubModel, submodel
from .token import Token

if _TYPE_CHECKING:  # for type checkers and the docs; at run time: __getattr__ below
    from .lm.hf.cached_causal_lm import CachedCausalLM

__version__ = "0.1.0"

__all__ = [
    "Model",
    "LMContext",
    "LMNextToken",
    "LMTokenMask",
    "Token",
    "Distribution",
    "Bernoulli",
    "Categorical",
    "Geometric",
    "Uniform",
    "Dirac",
    "TokenCategorical",
    "Transformer",
    "LanguageModel",
    "FunctionLM",
    "CachedCausalLM",
    "VLLMLM",
    "ByteLM",
    "run",
    "current_rng",
    "using_rng",
    "SubModel",
    "submodel",
    "sample_word",
    "sample_word_2",
]

# The HF backend loads transformers (seconds), which programs on a FunctionLM or a VLLMLM never
# need: it is imported when CachedCausalLM is first looked up (see llamppl.lazy_exports).
__getattr__, __dir__ = lazy_exports.lazy_exports(
    globals(), {"CachedCausalLM": "llamppl.lm.hf.cached_causal_lm:CachedCausalLM"}
)

# LLaMPPL's names and module paths (``from llamppl import smc_standard``, ``llamppl.llms``, ...)
# are rows of one table, served from here on by one import hook: see llamppl.compat.
from . import compat  # noqa: E402

compat.install()
