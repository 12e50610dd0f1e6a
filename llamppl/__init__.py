"""llamppl: probabilistic programming with language models, steered by sequential Monte Carlo.

Write a :class:`Model` subclass whose ``step`` uses ``sample`` / ``observe`` /
``condition`` / ``twist``, then run an algorithm from :mod:`llamppl.inference`::

    from llamppl import Model, LMContext, CachedCausalLM, run
    from llamppl.inference import smc_steer
    lm = CachedCausalLM.default()
    result = run(smc_steer(MyModel(lm, "The Fed says"), n_particles=8, n_beam=3, seed=0))
"""

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
from .lm import VLLMLM, CachedCausalLM, FunctionLM, LanguageModel
from .modeling import Model
from .rng import current_rng, using_rng
from .runner import run
from .token import Token

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
    "run",
    "current_rng",
    "using_rng",
]
