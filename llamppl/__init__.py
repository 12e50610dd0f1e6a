"""llamppl: probabilistic programming with language models, steered by sequential Monte Carlo.

Write a :class:`Model` subclass whose ``step`` uses ``sample`` / ``observe`` /
``condition`` / ``twist``, then run an algorithm from :mod:`llamppl.inference`::

    from llamppl import Model, LMContext, CachedCausalLM, run
    from llamppl.inference import smc_steer
    lm = CachedCausalLM.default()
    result = run(smc_steer(MyModel(lm, "The Fed says"), n_particles=8, n_beam=3, seed=0))
"""

import warnings as _warnings

# transformers imports tqdm.auto, which in Jupyter without ipywidgets warns "IProgress not
# found" and then uses the plain text bar anyway: import it first, without the warning
with _warnings.catch_warnings():
    _warnings.filterwarnings("ignore", message="IProgress not found")
    import tqdm.auto as _tqdm_auto  # noqa: F401

from .chunks import sample_word, sample_word_2
from .context import LMContext, LMNextToken, LMTokenMask
from .distributions import (
    Bernoulli,
    Categorical,
    Dirac,
    Distribution,
    Geometric,
    LogCategorical,
    TokenCategorical,
    Transformer,
    Uniform,
)
from .llms import CachedTransformer
from .lm import VLLMLM, CachedCausalLM, FunctionLM, LanguageModel
from .modeling import Model
from .rng import current_rng, using_rng
from .runner import run
from .submodel import SubModel, submodel
from .token import Token

__version__ = "0.1.0"

_INFERENCE_NAMES = (
    "smc_standard",
    "smc_steer",
    "importance_sampling",
    "enumerate_exact",
    "csmc_standard",
    "particle_gibbs",
)

__all__ = [
    "Model",
    "LMContext",
    "LMNextToken",
    "LMTokenMask",
    "Token",
    "Distribution",
    "Bernoulli",
    "Categorical",
    "LogCategorical",
    "Geometric",
    "Uniform",
    "Dirac",
    "TokenCategorical",
    "Transformer",
    "LanguageModel",
    "FunctionLM",
    "CachedCausalLM",
    "CachedTransformer",
    "VLLMLM",
    "run",
    "current_rng",
    "using_rng",
    "SubModel",
    "submodel",
    "sample_word",
    "sample_word_2",
    *_INFERENCE_NAMES,
]


def __getattr__(name: str):
    """LLaMPPL compatibility: ``from llamppl import smc_standard, smc_steer, csmc_standard, ...``.

    The names live in the top-level ``inference`` package, which depends on this
    core package; it is imported here lazily, on first access only, so importing
    ``llamppl`` never imports ``inference`` (the dependency direction stays).
    """
    if name in _INFERENCE_NAMES:
        import importlib

        return getattr(importlib.import_module(".inference", __name__), name)
    raise AttributeError(f"module 'llamppl' has no attribute {name!r}")
