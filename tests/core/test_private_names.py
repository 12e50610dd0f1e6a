"""Structure rules of the engines and the DSL, checked on the source.

- No private name (``_x``) is imported from, or used on an object of, another
  module: the engines reach ``Model`` through its documented interface, submodels
  reach their parent the same way, and ``LMContext`` state changes through methods.
- Every "integer / real, but not bool" type test lives in ``llamppl/validation.py``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OWN = sorted(
    str(p.relative_to(ROOT))
    for folder in ("llamppl", "inference", "models")
    for p in (ROOT / folder).rglob("*.py")
)  # every module of the package


# Private names of other libraries that have no public spelling: transformers keeps the
# attention implementation a draft model must copy only on ``config._attn_implementation``;
# vLLM's KV-connector base class hands its subclasses the scheduler's block table as
# ``self._kv_cache_manager`` (set by ``bind_kv_cache_manager``) and the step's metadata
# through ``self._get_connector_metadata()`` (llamppl/lm/vllm/fork.py subclasses it);
# jsonschema's validators hold their ``referencing`` resolver (``$id`` bases, anchors) only as
# ``validator._resolver`` (llamppl/decoding/grammar/json_order.py looks references up in it).
# torch's CPU flash attention returns each query's log-sum-exp only as the aten op
# ``_scaled_dot_product_flash_attention_for_cpu`` (llamppl/lm/hf/block_attention.py merges blocks).
THIRD_PARTY = {
    "_attn_implementation",
    "_kv_cache_manager",
    "_get_connector_metadata",
    "_resolver",
    "_scaled_dot_product_flash_attention_for_cpu",
}


def private_crossings(source: str) -> list[str]:
    """Private names this module imports, or uses on objects, without defining them itself."""
    tree = ast.parse(source)
    own = set()  # private names this module defines: functions, classes, globals, self._x
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            own.add(node.attr)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            found += [
                f"line {node.lineno}: imports {a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
        elif isinstance(node, ast.Attribute):
            name = node.attr
            if (
                name.startswith("_")
                and not name.startswith("__")
                and name not in own
                and name not in THIRD_PARTY
            ):
                found.append(f"line {node.lineno}: uses .{name}")
    return found


def test_the_check_sees_the_crossings_it_forbids():
    assert private_crossings("from .distributions import _token_support") == [
        "line 1: imports _token_support"
    ]
    assert private_crossings("def f(parent):\n    return parent._sample(1)") == [
        "line 2: uses ._sample"
    ]
    assert private_crossings("def f(child):\n    child._replay = 1") == ["line 2: uses ._replay"]
    assert private_crossings("class A:\n    def f(self):\n        self._x = other._x") == []


@pytest.mark.parametrize("path", OWN)
def test_no_private_name_crosses_a_module(path):
    assert private_crossings((ROOT / path).read_text()) == []


BOOL_PATTERN = re.compile(r"isinstance\([^()]*,\s*bool\)\s+or\s+not\s+isinstance")


def test_integer_and_real_checks_live_in_validation():
    offenders = [
        f"{p.relative_to(ROOT)}:{i}"
        for folder in ("llamppl", "inference", "models")
        for p in sorted((ROOT / folder).rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if BOOL_PATTERN.search(line) and p.name != "validation.py"
    ]
    assert offenders == []
