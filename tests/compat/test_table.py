"""The compatibility table (``llamppl.compat``): every row is served, documented, and out of the core.

- ``docs/compat.md`` lists exactly the table's rows (both ways), and every name the page
  calls an alias is in the table;
- every row is installed as its kind says (module path, name, rename, adapter, second form);
- the core modules and classes do not define the old spellings themselves;
- ``import llamppl`` does not import the engines, ``hfppl`` alone works, and the hook
  sorts a row for a moved module as the lead adds them.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from warning_policy import pythonwarnings

import llamppl
from llamppl.compat import ROWS, Rows, SecondForm, resolve
from llamppl.compat.table import ALIASES
from llamppl.inference.compat_engines import LLAMPPL_POSITIONAL

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "compat.md"
FOLDERS = {"llamppl.inference": ROOT / "inference", "llamppl.models": ROOT / "models"}


def documented_rows() -> dict[str, str]:
    """``{old: ours}`` of the page's section "The compatibility table"."""
    section = DOC.read_text(encoding="utf-8").split("\n## The compatibility table\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|", section, re.M))


def test_the_page_lists_every_row_and_only_rows():
    documented = documented_rows()
    assert sorted(ALIASES.keys() - documented.keys()) == [], "rows missing from docs/compat.md"
    assert sorted(documented.keys() - ALIASES.keys()) == [], "documented rows not in the table"
    assert {k: v for k, v in documented.items() if ALIASES[k] != v} == {}


def test_every_alias_the_page_names_is_a_row():
    keys = {re.split(r"[:.]", k)[-1] for k in ALIASES} | set(LLAMPPL_POSITIONAL)
    text = DOC.read_text(encoding="utf-8")
    rows = re.findall(r"^\| (.+?) \| alias \|", text, re.M)
    assert len(rows) >= 8
    for cell in rows:
        names = {
            re.split(r"[(=]", span)[0].split(".")[-1] for span in re.findall(r"`([^`]+)`", cell)
        }
        assert names & keys, f"docs/compat.md calls {cell} an alias, but no row spells it"


def source_file(module: str) -> Path | None:
    """The repository file of one of our modules (None when there is none)."""
    folder, package = ROOT / "llamppl", "llamppl"
    for name, path in FOLDERS.items():
        if module == name or module.startswith(name + "."):
            folder, package = path, name
    rel = module[len(package) :].lstrip(".").replace(".", "/")
    for path in (folder / f"{rel}.py", folder / rel / "__init__.py"):
        if path.is_file():
            return path
    return None


def test_old_module_paths_are_not_modules_of_ours():
    made = [m for m in ROWS.names if source_file(m) is None]
    assert "llamppl.llms" in made and "llamppl.distributions.lmcontext" in made
    for old in [*ROWS.modules, *made]:
        if old.startswith("llamppl"):
            assert source_file(old) is None, f"{old} is a row and a file"


def adapter_file(obj: Any) -> str:
    """The file that defines ``obj`` (unwrapping properties, classmethods, descriptors)."""
    obj = getattr(obj, "fget", None) or getattr(obj, "__func__", None) or obj
    code = getattr(obj, "__code__", None)
    if code is not None:
        return code.co_filename
    return inspect.getfile(obj if isinstance(obj, type) else type(obj))


# Adapters live in the compat package, or beside the engines they adapt (imports point down).
COMPAT = (str(ROOT / "llamppl" / "compat"), str(ROOT / "inference" / "compat_engines.py"))


@pytest.mark.parametrize("old", sorted(ALIASES), ids=str)
def test_every_row_is_served(old):
    ours = ALIASES[old]
    module, _, qualname = old.partition(":")
    if not qualname:
        assert importlib.import_module(old) is importlib.import_module(ours)
        return
    owner = resolve(module)
    parts = qualname.split(".")
    if len(parts) == 2:  # a class attribute
        cls = getattr(owner, parts[0])
        found = inspect.getattr_static(cls, parts[1])
        target_module, _, target = ours.partition(":")
        if target_module == module and target.startswith(parts[0] + "."):  # a rename
            new = target.split(".")[1]
            static = inspect.getattr_static(cls, new, None)
            assert found is static or adapter_file(found).startswith(COMPAT)
        else:
            assert adapter_file(found).startswith(COMPAT), f"{old} is not the adapter"
        return
    value = getattr(owner, qualname)
    if isinstance(resolve(ours), SecondForm):
        assert adapter_file(value).startswith(COMPAT)
    else:
        assert value is resolve(ours)
        assert qualname in owner.__all__ and qualname in dir(owner)


def defined_names(body: list[ast.stmt]) -> set[str]:
    out = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return out


def test_the_core_does_not_spell_the_old_names():
    # each owner's source defines our API only; the old spellings come from the table
    for module, names in ROWS.names.items():
        path = source_file(module)
        if path is None:
            continue  # a module made from its rows
        tree = ast.parse(path.read_text(encoding="utf-8"))
        second = {n for n, v in names.items() if isinstance(resolve(v), SecondForm)}
        assert defined_names(tree.body) & (set(names) - second) == set(), module
    for module, classes in ROWS.attributes.items():
        tree = ast.parse(source_file(module).read_text(encoding="utf-8"))
        bodies = {n.name: n.body for n in tree.body if isinstance(n, ast.ClassDef)}
        for cls, attributes in classes.items():
            second = {a for a, v in attributes.items() if v.startswith("llamppl.compat")}
            second = {a for a in second if isinstance(resolve(attributes[a]), SecondForm)}
            assert defined_names(bodies[cls]) & (set(attributes) - second) == set(), cls
            assert second <= defined_names(bodies[cls]), f"{cls}: a second form of a name not ours"


def test_renames_are_one_attribute_at_every_level():
    from llamppl import FunctionLM
    from llamppl.lm.base import LanguageModel

    assert (
        vars(FunctionLM)["_next_token_logprobs_batch"]
        is vars(FunctionLM)["next_token_logprobs_batch"]
    )
    lm = FunctionLM(["a", "<eos>"], 1, lambda ctx: [0.0, 0.0])
    assert lm.str_vocab is lm.vocab
    lm.str_vocab = ["x", "<eos>"]  # LLaMPPL-era code assigning the old name sets ours
    assert lm.vocab == ["x", "<eos>"]

    class Ported(LanguageModel):  # a LLaMPPL-era backend overriding the old name of our method
        vocab = ["a"]
        eos_token_id = 0

        def next_token_logprobs_unbatched(self, token_ids):
            return "theirs"

    assert Ported().next_token_logprobs_sync([0]) == "theirs"
    assert LanguageModel.next_token_logprobs_unbatched is LanguageModel.next_token_logprobs_sync


def test_the_smc_standard_row_keeps_our_signature_and_adds_llamppls():
    from llamppl.inference import smc_standard

    params = list(inspect.signature(smc_standard).parameters)
    assert params[:6] == ["model", "n_particles", "ess_threshold", *LLAMPPL_POSITIONAL]
    assert {"resampling", "seed", "progress", "record", "max_steps"} <= set(params)
    assert smc_standard.__name__ == "smc_standard" and "Run SMC" in smc_standard.__doc__


def test_rows_sort_by_kind_and_a_moved_module_is_one_row():
    rows = Rows(
        {
            "llamppl.lm.vllm_lm": "llamppl.lm.vllm.vllm_lm",  # a move, as the lead adds them
            "old": "llamppl",
            "llamppl.x:Name": "llamppl.y:Name",
            "llamppl.x:Cls.old": "llamppl.x:Cls.new",
        }
    )
    assert rows.our_module("llamppl.lm.vllm_lm") == "llamppl.lm.vllm.vllm_lm"
    assert rows.our_module("old.lm.vllm_lm") == "llamppl.lm.vllm.vllm_lm"  # rows chain
    assert rows.our_module("llamppl.lm.base") == "llamppl.lm.base"
    assert rows.names == {"llamppl.x": {"Name": "llamppl.y:Name"}}
    assert rows.attributes == {"llamppl.x": {"Cls": {"old": "llamppl.x:Cls.new"}}}
    assert rows.owners() == {"llamppl.x"} and rows.roots == {"llamppl", "old"}
    with pytest.raises(ValueError, match="loop"):
        Rows({"a": "b", "b": "a"}).our_module("a")


def test_llamppl_alone_imports_neither_engines_nor_transformers_and_hfppl_alone_is_llamppl():
    code = (
        "import sys, llamppl\n"
        "assert 'llamppl.inference' not in sys.modules\n"
        # the HF backend (transformers: seconds) loads when CachedCausalLM is first looked up
        "assert 'transformers' not in sys.modules and 'llamppl.lm.hf' not in sys.modules\n"
        "assert 'CachedCausalLM' in dir(llamppl) and 'CacheStats' in dir(llamppl.lm)\n"
        "f = llamppl.smc_standard\n"
        "assert 'llamppl.inference' in sys.modules and f is sys.modules['llamppl.inference'].smc_standard\n"
        # nor do the programs and constraints (the LogitsProcessors load on first look-up)
        "import llamppl.constraints, llamppl.models\n"
        "assert 'transformers' not in sys.modules and 'PowerLawSampler' in dir(llamppl.models)\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": pythonwarnings()}  # the suite's warning policy
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300, env=env)
    code = "import hfppl, llamppl\nassert hfppl is llamppl\nfrom hfppl.llms import Token\n"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300, env=env)


def test_old_names_join_all_and_star_imports():
    namespace: dict[str, Any] = {}
    exec("from llamppl import *", namespace)
    assert namespace["smc_steer"] is llamppl.smc_steer and namespace["LogCategorical"]
    assert "CachedTransformer" in dir(llamppl)
    # CachedCausalLM is looked up on first use (it loads transformers), one class everywhere
    assert namespace["CachedCausalLM"] is llamppl.lm.CachedCausalLM is llamppl.lm.hf.CachedCausalLM
    from llamppl import decoding, models
    from llamppl.decoding import power_law
    from llamppl.decoding.power_law import sampler

    assert models.PowerLawSampler is decoding.PowerLawSampler is power_law.PowerLawSampler
    assert models.POWER_LAW_PRESETS is decoding.POWER_LAW_PRESETS is power_law.PRESETS
    assert models.PowerLawDraw is sampler.PowerLawDraw is power_law.PowerLawDraw
    assert models.GrammarLogitsProcessor.__module__ == "llamppl.decoding.grammar.logits"
    with pytest.raises(AttributeError, match="'llamppl.models' has no attribute 'no_such_name'"):
        _ = models.no_such_name
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = llamppl.no_such_name
