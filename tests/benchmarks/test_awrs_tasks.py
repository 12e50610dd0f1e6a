"""The molecule and pattern benchmark modules: the parts that need no LM.

``benchmarks/awrs_tasks.py`` (instances, prompts, stop rule, the checks as library
constraints), ``awrs_metrics.py`` (metric, posterior score, bootstrap), ``awrs_records.py``
(records, table), ``awrs_report.py`` (command line) and the counted constraints of
``awrs_runs.py``. The constraints themselves are tested with the library
(``tests/decoding/test_smiles.py``, ``tests/models/test_smiles_exactness.py``).
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import awrs_metrics as M  # noqa: E402
import awrs_records as R  # noqa: E402
import awrs_report  # noqa: E402
import awrs_tasks as T  # noqa: E402

from llamppl.constraints import CheckTimeout, regex_prefix  # noqa: E402
from llamppl.decoding.chemistry import Smiles, smiles  # noqa: E402

needs_data = pytest.mark.skipif(
    not T.MOLECULES_FILE.is_file() or not T.PATTERNS_FILE.is_file(),
    reason=f"shared data not found under {T.DATA}",
)


class ChatTokenizer:
    """A tokenizer stand-in with SmolLM2's chat template written out."""

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        assert tokenize is False
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


# ----------------------------------------------------------------------------- instances, prompts


@needs_data
def test_molecule_prompts_are_deterministic_for_a_seed_and_hold_20_molecules():
    a = T.instances("molecules", 5, seed=1234)
    b = T.instances("molecules", 5, seed=1234)
    assert a == b
    assert [i.id for i in a] == list(range(5))
    for inst in a:
        assert len(inst.molecules) == 20 and len(set(inst.molecules)) == 20
        lines = inst.prompt().split("\n")
        assert lines[0] == T.MOLECULE_SYSTEM_PROMPT
        assert lines[1:21] == [f"Molecule: {m}" for m in inst.molecules]
        assert lines[21:] == ["Molecule:"]
    assert T.instances("molecules", 5, seed=1235) != a
    assert len({i.molecules for i in a}) == 5  # each instance draws its own 20


@needs_data
def test_molecule_draws_are_genlm_evals():
    """genlm-eval: ``random.seed(seed)`` then one ``random.sample(range(n), 20)`` per instance."""
    molecules = T.load_molecules()
    assert len(molecules) == 30 and all(m and " " not in m for m in molecules)
    random.seed(1234)
    expected = [[molecules[i] for i in random.sample(range(30), 20)] for _ in range(3)]
    assert [list(i.molecules) for i in T.instances("molecules", 3, seed=1234)] == expected
    # the first n of 100 are the n instances
    assert T.instances("molecules", 100, seed=1234)[:3] == T.instances("molecules", 3, seed=1234)


@needs_data
def test_pattern_prompt_is_the_chat_template_of_genlm_evals_messages():
    patterns = T.load_patterns()
    assert len(patterns) == 248 and patterns[7] == r"(\w)\1{2,}"  # a quoted CSV field
    insts = T.instances("patterns", 8, seed=1234)
    assert insts == T.instances("patterns", 8, seed=1234)
    assert len({i.id for i in insts}) == 8
    inst = insts[0]
    assert inst.pattern == patterns[inst.id]
    text = inst.prompt(ChatTokenizer())
    assert text.startswith(f"<|im_start|>system\n{T.PATTERN_SYSTEM_PROMPT}<|im_end|>\n")
    assert "<|im_start|>user\n(ab)+<|im_end|>\n<|im_start|>assistant\nab<|im_end|>\n" in text
    assert text.endswith(f"<|im_start|>user\n{inst.pattern}<|im_end|>\n<|im_start|>assistant\n")
    assert [m["role"] for m in inst.messages()] == ["system"] + ["user", "assistant"] * 3 + ["user"]
    with pytest.raises(TypeError, match="tokenizer"):
        inst.prompt()


@needs_data  # the n_molecules check reads the file's length
def test_bad_instance_arguments_are_refused():
    with pytest.raises(ValueError, match="task must be one of"):
        T.instances("proteins", 1)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        T.instances("molecules", 0)
    with pytest.raises(ValueError, match="n_molecules"):
        T.instances("molecules", 1, n_molecules=31)


# ----------------------------------------------------------------------------- stopping rule


def test_stop_rule_is_eos_or_a_newline_token_within_100_tokens():
    assert T.STOP.max_tokens == 100
    assert T.STOP.ends("C\n") and T.STOP.ends(b"\n\n") and T.STOP.ends("<|im_end|>", is_eos=True)
    assert not T.STOP.ends("CC") and not T.STOP.ends("<|im_end|>")
    vocab = ["a", "b\n", "<eos>", "\n", "c"]
    assert T.STOP.stop_token_ids(vocab, [2]) == [1, 2, 3]
    assert T.StopRule(newline=False).stop_token_ids(vocab, [2]) == [2]
    with pytest.raises(ValueError, match="max_tokens"):
        T.StopRule(max_tokens=0)


# ----------------------------------------------------------------------------- checks


@pytest.mark.parametrize(
    "prefix",
    ["", "C", "CC(", "C1=CC", "c1cc", "CC(=O)O", "N#C", "[NH4+", "C1CC1", "Oc1ccccc1", "C)", "CX"],
)
def test_molecule_checks_are_the_librarys_smiles_constraint(prefix):
    pytest.importorskip("partialsmiles")
    inst = T.MoleculeInstance("molecules", 0, ("C",))
    assert isinstance(inst.constraint, Smiles) and inst.constraint.leading_space
    assert inst.constraint is inst.constraint  # built once: its verdicts are remembered
    library = smiles(leading_space=True)
    for text in (prefix, " " + prefix):  # the space after "Molecule:"
        assert inst.prefix_ok(text) is library(text)
        assert inst.complete_ok(text) is library.accepts_end(text)
    assert inst.prefix_ok(" CC(") and not inst.complete_ok(" CC(")
    assert inst.complete_ok(" CC(=O)O") and not inst.prefix_ok("C)")


@pytest.mark.parametrize(
    ("pattern", "text", "prefix", "complete"),
    [
        (r"^(\w)(\w)(?:\2\1)+$", "ab", True, False),
        (r"^(\w)(\w)(?:\2\1)+$", "abba", True, True),
        (r"^(\w)(\w)(?:\2\1)+$", "abbx", False, False),
        (r"(?<!\d{3})abc(?!\d{3})", "ab", True, False),
        (r"a|ab", "ab", True, True),  # a first-match prefix test would refuse this
        (r"\d{3}-\d{4}", "12a", False, False),
        (r"(?>one|two|three)", "", True, False),
    ],
)
def test_pattern_checks_are_regex_prefix_a_partial_full_match(pattern, text, prefix, complete):
    import regex

    assert (regex.fullmatch(pattern, text, partial=True) is not None) is prefix
    assert (regex.fullmatch(pattern, text) is not None) is complete
    inst = T.PatternInstance("patterns", 0, pattern)
    assert repr(inst.constraint) == repr(regex_prefix(pattern))
    assert inst.prefix_ok(text) is prefix and inst.complete_ok(text) is complete


def test_checks_run_under_the_librarys_time_bound():
    evil = r"^(a|aa)+$"  # exponential backtracking in the regex package
    text = "a" * 40 + "b"
    inst = T.PatternInstance("patterns", 0, evil)
    with pytest.raises(CheckTimeout):
        inst.complete_ok(text, timeout=0.05)
    assert issubclass(CheckTimeout, BaseException) and not issubclass(CheckTimeout, Exception)
    assert M.pattern_score(evil, text, timeout=0.05) == M.Score(False, 0.0)
    with pytest.raises(ValueError, match="timeout"):
        inst.prefix_ok("a", timeout=0)
    for module in ("awrs_tasks", "awrs_metrics", "awrs_records", "awrs_runs"):
        source = (BENCHMARKS / f"{module}.py").read_text()
        assert "class CheckTimeout" not in source and "setitimer" not in source, module


def test_counted_constraints_of_the_runs_are_the_library_checks_counted():
    pytest.importorskip("partialsmiles")
    import awrs_runs

    closed, plain, need = (
        awrs_runs.CountedSmiles(),
        awrs_runs.CountedPlainSmiles(),
        awrs_runs.CountedSmilesWithNeed(),
    )
    assert closed.prefix_closed and not plain.prefix_closed
    assert closed(" CC(") and not closed(" CC(X") and closed.accepts_end(" CCO")
    assert closed.calls == 3 and closed.parses >= 3
    assert need.need(None, " BrC1=C2C3CC(C") == 4
    regex_c, regex_plain = awrs_runs.CountedRegex("ab+"), awrs_runs.CountedPlainRegex("ab+")
    assert regex_c.prefix_closed and not regex_plain.prefix_closed
    assert regex_c("ab") and not regex_c.accepts_end("a") and regex_c.calls == 2


# ----------------------------------------------------------------------------- metrics


def test_molecule_metric_on_known_molecules():
    pytest.importorskip("rdkit")
    from rdkit import Chem
    from rdkit.Chem import QED

    aspirin = "CC(=O)Oc1ccccc1C(=O)O"
    valid, qed = M.molecule_score(" " + aspirin + " ")
    assert valid and qed == pytest.approx(QED.qed(Chem.MolFromSmiles(aspirin)))
    assert 0.5 < qed < 0.6  # aspirin's QED is 0.55
    assert M.molecule_score("c1cccc1") == M.Score(False, 0.0)  # parses only without kekulizing
    assert M.molecule_score("C1CC") == M.Score(False, 0.0)  # open ring
    assert M.molecule_score("") == M.Score(False, 0.0)
    assert T.MoleculeInstance("molecules", 0, ("C",)).score("CCO").valid


def test_pattern_metric_is_fullmatch():
    assert M.pattern_score(r"\d+", "123") == M.Score(True, 1.0)
    assert M.pattern_score(r"\d+", "123a") == M.Score(False, 0.0)
    assert M.pattern_score(r"\d+", "12") == M.Score(True, 1.0)


def test_posterior_score_weights_finished_particles_only():
    def score(text):
        return M.Score(text == "good", 1.0 if text == "good" else 0.0)

    particles = [
        M.Particle("good", 0.5, True),
        M.Particle("bad", 0.25, True),
        M.Particle("good", 0.25, False),  # cut at the token limit: left out
    ]
    s, v = M.posterior_score(particles, score)
    assert s == pytest.approx(0.5 / 0.75) and v == pytest.approx(0.5 / 0.75)
    assert M.posterior_score(particles, score, finished_only=False)[0] == pytest.approx(0.75)
    assert M.posterior_score([M.Particle("good", 1.0, False)], score) == (0.0, 0.0)
    assert M.posterior_score([], score) == (0.0, 0.0)


def test_bootstrap_interval_contains_the_mean_and_is_seeded():
    values = [0.1, 0.5, 0.4, 0.9, 0.3, 0.2, 0.7]
    mean, low, high = M.bootstrap_ci(values, seed=3)
    assert mean == pytest.approx(sum(values) / len(values))
    assert low < mean < high and min(values) <= low and high <= max(values)
    assert M.bootstrap_ci(values, seed=3) == (mean, low, high)
    assert M.bootstrap_ci([0.5, 0.5]) == (0.5, 0.5, 0.5)
    wide = M.bootstrap_ci(values, level=0.99, seed=3)
    assert wide[1] <= low and wide[2] >= high
    with pytest.raises(ValueError, match="non-empty"):
        M.bootstrap_ci([])
    with pytest.raises(ValueError, match="level"):
        M.bootstrap_ci(values, level=1.0)


# ----------------------------------------------------------------------------- records, report


def _record(**kw):
    base = dict(
        method="genlm-control AWRS-SMC",
        task="molecules",
        instance=3,
        replicate=1,
        n_particles=2,
        particles=[M.Particle(" CCO", 0.75, True), M.Particle(" CC(C", 0.25, False)],
        score=0.4,
        valid=1.0,
        predicate_calls=40,
        generated_tokens=20,
        cpu_seconds=12.5,
        wall_seconds=13.0,
        extra={"seed": 1234, "log_ml": -3.5},
    )
    base.update(kw)
    return R.RunRecord(**base)


def test_record_round_trips_through_a_jsonl_file(tmp_path):
    path = tmp_path / "runs.jsonl"
    first = _record()
    second = _record(replicate=2, particles=[], error="timeout: no result within 5 s", score=0.0)
    R.append_record(path, first)
    R.append_record(path, second)
    assert path.read_text().count("\n") == 2
    back = R.read_records(path)
    assert back == [first, second]
    assert back[0].particles[1] == M.Particle(" CC(C", 0.25, False)
    with pytest.raises(ValueError, match="task"):
        _record(task="proteins")
    with pytest.raises(ValueError, match="predicate_calls"):
        _record(predicate_calls=-1)


def test_report_has_one_row_per_method_with_its_figures(tmp_path, capsys):
    path = tmp_path / "runs.jsonl"
    for rep, (score, calls, cpu) in enumerate([(0.4, 40, 10.0), (0.6, 20, 30.0), (0.5, 60, 20.0)]):
        R.append_record(
            path, _record(replicate=rep, score=score, predicate_calls=calls, cpu_seconds=cpu)
        )
    R.append_record(path, _record(method="ours", score=0.0, valid=0.0, error="timeout"))
    rows = {r["method"]: r for r in R.summarize(R.read_records(path))}
    peer = rows["genlm-control AWRS-SMC"]
    assert peer["records"] == 3 and peer["score"] == pytest.approx(0.5)
    assert peer["score_low"] <= 0.5 <= peer["score_high"]
    assert peer["cpu_s"] == 20.0 and peer["calls_per_token"] == 2.0 and peer["errors"] == 0
    assert rows["ours"]["errors"] == 1 and rows["ours"]["timeouts"] == 1
    assert rows["ours"]["valid"] == 0.0 and peer["timeouts"] == 0
    awrs_report.main([str(path)])
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].split()[:2] == ["task", "method"]
    assert any(line.startswith("molecules  genlm-control AWRS-SMC") for line in out)
    assert out[-1].startswith('{"awrs_report": [')
    assert math.isfinite(rows["ours"]["cpu_s"])
    with pytest.raises(SystemExit):
        awrs_report.main([str(tmp_path / "missing.jsonl")])
    assert "no such file" in capsys.readouterr().err


@needs_data  # the examples draw instances from the shared files
def test_module_docstring_examples_run():
    pytest.importorskip("rdkit")
    pytest.importorskip("partialsmiles")
    import doctest

    attempted = 0
    for module in (T, M):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, module.__name__
        attempted += result.attempted
    assert attempted >= 6
