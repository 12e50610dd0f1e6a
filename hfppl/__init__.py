"""``hfppl``: LLaMPPL's earlier name, kept so programs written for it run unchanged.

``hfppl`` is ``llamppl`` itself, every module path included (``hfppl.Model is llamppl.Model``,
``import hfppl.llms`` gives ``llamppl.llms``): the name is one row of the compatibility table
(:mod:`llamppl.compat`), served by its import hook::

    from hfppl import CachedCausalLM, LMContext, Model, smc_standard
    from hfppl.distributions.lmcontext import LMContext

This file exists only because a fresh interpreter looks for a top-level name on disk before
any hook runs; importing ``llamppl.compat`` installs the hook, and the name goes to the table.
"""

import sys

from llamppl.compat import resolve

sys.modules[__name__] = resolve(__name__)
