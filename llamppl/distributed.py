"""``llamppl.distributed``: the name users know for :mod:`llamppl.inference.distributed`.

The fan-out code lives with the engines it calls (``inference/distributed.py``); this
module is an alias at the API edge, like the lazy ``llamppl.smc_standard``. Nothing in the
core imports it, and the core imports nothing above itself because of it: the import
below runs only when a user imports ``llamppl.distributed``.
"""

import sys as _sys

from llamppl.inference import distributed as _distributed

_sys.modules[__name__] = _distributed
