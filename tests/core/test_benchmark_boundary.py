"""Library logic never lives in ``benchmarks/``: nothing but the benchmarks' own tests loads it.

``benchmarks/`` holds measurements that import the library; the library (``llamppl/``,
``models/``, ``inference/``) never imports a benchmark module, and no test outside
``tests/benchmarks/`` does either (by import, by a ``sys.path`` entry or by file path), so a
library test never depends on a benchmark script.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARK_MODULES = {p.stem for p in (ROOT / "benchmarks").rglob("*.py")}


def _docstrings(tree: ast.Module) -> set[int]:
    """``id`` of every docstring node (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def benchmark_uses(path: Path) -> list[str]:
    """Imports of benchmark modules, and string constants naming ``benchmarks`` (a path)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module.split(".")[0]]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docs
            and "benchmarks" in node.value
        ):
            found.append(f"line {node.lineno}: names {node.value!r}")
            continue
        else:
            continue
        found += [f"line {node.lineno}: imports {n}" for n in names if n in BENCHMARK_MODULES]
    return found


def test_the_benchmark_modules_are_found():
    assert {"awrs_tasks", "awrs_metrics", "awrs_records", "awrs_runs"} <= BENCHMARK_MODULES


def test_the_library_never_imports_a_benchmark():
    offenders = {
        str(p.relative_to(ROOT)): uses
        for folder in ("llamppl", "models", "inference")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if (uses := [u for u in benchmark_uses(p) if "imports" in u])
    }
    assert offenders == {}


def test_no_test_outside_tests_benchmarks_loads_a_benchmark():
    offenders = {
        str(p.relative_to(ROOT)): uses
        for p in sorted((ROOT / "tests").rglob("*.py"))
        if "benchmarks" not in p.relative_to(ROOT / "tests").parts[:1]
        and p.name != Path(__file__).name
        and (uses := benchmark_uses(p))
    }
    assert offenders == {}
