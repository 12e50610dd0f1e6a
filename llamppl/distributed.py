"""``llamppl.distributed``: the name users know for :mod:`llamppl.inference.distributed`.

The fan-out code lives with the engines it calls (``inference/distributed.py``); this
module is an alias at the API edge, like the lazy ``llamppl.smc_standard``. Nothing in the
core imports it, and the core imports nothing above itself because of it: the engines'
module is loaded (through ``importlib``, as the package root's lazy names are) only when a
user imports ``llamppl.distributed``, and then stands in for this module.
"""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("llamppl.inference.distributed")
