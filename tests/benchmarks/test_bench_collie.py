"""The COLLIE benchmark's own scripts: the judge (``benchmarks/collie_judge.py``) and the
parts of ``benchmarks/bench_collie.py`` that need no LM run.

The judge: every shared instance whose ``reference_passes`` is true accepts its reference
text and the others reject theirs (so the library's tests may use ``reference_passes`` as the
judge's verdict); prompts are chosen reproducibly; NLTK's data folder follows the user. The
benchmark: it only imports the library's constraint, plain characters and token budget
(``llamppl.constraints``), and reports averages over structures.
"""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("nltk")
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import collie_judge as cj  # noqa: E402  (points NLTK_DATA at the shared Punkt data)

needs_data = pytest.mark.skipif(not cj.DATA.is_file(), reason=f"no COLLIE data at {cj.DATA}")


@pytest.fixture(scope="module")
def instances() -> list[dict]:
    return cj.load()


# ---------------------------------------------------------------------- the judge
@needs_data
def test_every_reference_verdict_agrees(instances):
    pytest.importorskip("collie.constraints")
    agree, differ = cj.check_references(instances)
    assert (agree, differ) == (1048, [])
    failing = [inst for inst in instances if not inst["reference_passes"]]
    assert len(failing) == 12  # the data README's curly-quote splits among them
    assert not any(cj.judge(inst, inst["example"]) for inst in failing)


@needs_data
def test_a_wrong_text_fails_and_a_right_one_passes(instances):
    pytest.importorskip("collie.constraints")
    c02 = next(inst for inst in instances if inst["structure"] == "c02")
    n, letters = c02["targets"]
    positions = c02["constraint"]["callables"][1]["transformation"]["position"]
    word = list("x" * n)
    for position, letter in zip(positions, letters):
        word[position] = letter
    assert cj.judge(c02, "".join(word))
    assert not cj.judge(c02, "".join(word) + "x")  # one character too many
    assert cj.judge(c02, "".join(word).upper())  # COLLIE compares in lower case


@needs_data  # COLLIE's checker splits with the Punkt data shared beside the repository
def test_rebuild_follows_the_readme():
    cc = pytest.importorskip("collie.constraints")
    tree = {
        "class": "All",
        "callables": [
            {
                "class": "Constraint",
                "input_level": {"class": "InputLevel", "level": "sentence"},
                "target_level": {"class": "TargetLevel", "level": "word"},
                "transformation": {"class": "ForEach", "func": {"class": "Ellipsis"}},
                "relation": {"class": "Relation", "operand": "in"},
                "reduction": {"class": "Reduction", "reduction": "any", "value": None},
            }
        ],
    }
    built = cj.rebuild(tree)
    assert isinstance(built, cc.All) and len(built.callables) == 1
    part = built.callables[0]
    assert part.transformation.func is ...
    assert (part.input_level.level, part.target_level.level) == ("sentence", "word")
    assert built.check("Red fox. Blue sky.", ["fox"])  # some sentence has the word
    assert not built.check("Red fox. Blue sky.", ["cat"])
    with pytest.raises(ValueError, match="'Nope'"):
        cj.rebuild({"class": "Nope"})
    with pytest.raises(ValueError, match="without a 'class'"):
        cj.rebuild({"level": "word"})


@needs_data
def test_prompts_sharing_a_text_share_the_task(instances):
    grouped = cj.distinct_prompts(instances)
    assert sum(len(p) for p in grouped.values()) == 721
    for by_prompt in grouped.values():
        for same in by_prompt.values():
            tasks = {json.dumps([i["targets"], i["constraint"]], sort_keys=True) for i in same}
            assert len(tasks) == 1


@needs_data
def test_choose_prompts_is_seeded_and_distinct(instances):
    a = cj.choose_prompts(instances, k=2, seed=0)
    assert list(a) == list(cj.STRUCTURES)
    assert a == cj.choose_prompts(instances, k=2, seed=0)
    assert a != cj.choose_prompts(instances, k=2, seed=1)
    for structure, chosen in a.items():
        prompts = [inst["prompt"] for inst in chosen]
        assert len(prompts) == len(set(prompts)) == 2
        assert all(inst["structure"] == structure for inst in chosen)
    few = cj.choose_prompts(instances, k=50, seed=0, structures=["c01"])
    assert len(few["c01"]) == 4  # all the distinct prompts c01 has
    with pytest.raises(ValueError, match="k must be a positive integer"):
        cj.choose_prompts(instances, k=0)
    with pytest.raises(ValueError, match="'c13' is not in the data"):
        cj.choose_prompts(instances, k=1, structures=["c13"])


@needs_data
def test_load_and_judge_name_bad_input(tmp_path: Path, instances):
    with pytest.raises(FileNotFoundError, match="no COLLIE data"):
        cj.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(ValueError, match="not a COLLIE file"):
        cj.load(bad)
    with pytest.raises(TypeError, match="text must be a str"):
        cj.judge(instances[0], None)


def test_nltk_data_follows_the_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    import nltk

    monkeypatch.setattr(nltk.data, "path", list(nltk.data.path))  # restored afterwards
    monkeypatch.setenv("NLTK_DATA", str(tmp_path))
    assert cj.use_nltk_data() == str(tmp_path)  # the user's folder wins
    assert cj.use_nltk_data(cj.NLTK_DATA, override=True) == str(cj.NLTK_DATA.resolve())
    assert os.environ["NLTK_DATA"] == str(cj.NLTK_DATA.resolve())
    assert str(tmp_path) in nltk.data.path
    assert str(cj.NLTK_DATA.resolve()) in nltk.data.path


# ---------------------------------------------------------------------- the benchmark
def test_the_benchmark_takes_its_constraint_from_the_library():
    """``bench_collie.py`` imports no constraint logic from ``benchmarks/``: the COLLIE
    translation, the plain characters and the token budget are ``llamppl.constraints``'."""
    tree = ast.parse((BENCHMARKS / "bench_collie.py").read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported |= {(node.module, a.name) for a in node.names}
        elif isinstance(node, ast.Import):
            imported |= {(a.name, None) for a in node.names}
    modules = {m for m, _ in imported}
    assert ("llamppl.constraints", "collie_constraint") in imported
    assert ("llamppl.constraints", "token_budget") in imported
    assert not modules & {"collie_program", "collie_translate"}
    assert not (BENCHMARKS / "collie_program.py").exists()
    assert not (BENCHMARKS / "collie_translate.py").exists()


def test_report_averages_over_structures(capsys: pytest.CaptureFixture[str]):
    import bench_collie

    records = [
        {"method": "smc", "structure": s, "satisfied": ok, "mean_logprob": -3.0, "cpu_seconds": c}
        for s, ok, c in (("c01", True, 1.0), ("c01", False, 2.0), ("c05", True, 4.0))
    ]
    x, y, z = bench_collie.report(records, ["smc"])
    assert (x, y) == (2, 3) and z == pytest.approx(75.0)  # (1/2 + 1/1) / 2
    out = capsys.readouterr().out
    assert "| c01 | 2 | 1/2" in out and "| smc | 75.0% |" in out
    lo, hi = bench_collie.wilson(0, 4)
    assert lo == 0.0 and 0 < hi < 1
