"""The shared AWRS task definitions (``benchmarks/awrs_tasks.py``): the parts that need no LM."""

from __future__ import annotations

import importlib.util
import math
import random
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load():
    spec = importlib.util.spec_from_file_location("awrs_tasks", BENCHMARKS / "awrs_tasks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["awrs_tasks"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


T = _load()
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


# ----------------------------------------------------------------------------- predicates


@pytest.mark.parametrize(
    "prefix",
    ["", "C", "CC(", "C1=CC", "c1cc", "CC(=O)O", "N#C", "[NH4+", "C1CC1", "Oc1ccccc1"],
)
def test_smiles_prefix_check_agrees_with_partialsmiles(prefix):
    ps = pytest.importorskip("partialsmiles")
    try:
        ps.ParseSmiles(prefix, partial=True)
        expected = True
    except Exception:  # noqa: BLE001
        expected = False
    assert T.smiles_prefix_ok(prefix) is expected
    assert T.smiles_prefix_ok(" " + prefix) is expected  # the space after "Molecule:"


def test_smiles_open_count_counts_open_rings_and_branches():
    assert T.smiles_open_count("") == 0 and T.smiles_open_count(" CC(=O)O") == 0
    assert T.smiles_open_count(" BrC1=C2C3CC(C") == 4  # rings 1, 2, 3 and one branch
    assert T.smiles_open_count("C1CC1") == 0 and T.smiles_open_count("C1CC2CC1") == 1
    assert T.smiles_open_count("C%12CC") == 1 and T.smiles_open_count("C%12CC%12") == 0
    assert T.smiles_open_count("C[NH3+]") == 0  # digits inside brackets are not ring bonds
    with pytest.raises(TypeError, match="text must be a str"):
        T.smiles_open_count(None)


def test_smiles_checks_accept_and_refuse_known_strings():
    pytest.importorskip("partialsmiles")
    assert T.smiles_prefix_ok(" CC(") and not T.smiles_complete_ok(" CC(")
    assert T.smiles_complete_ok(" CC(=O)O") and T.smiles_complete_ok("c1ccccc1")
    assert not T.smiles_prefix_ok("C)") and not T.smiles_prefix_ok("CX")
    assert not T.smiles_prefix_ok("hello") and not T.smiles_complete_ok("C1CC")
    with pytest.raises(TypeError, match="str"):
        T.smiles_prefix_ok(b"CC")


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
def test_pattern_checks_agree_with_regex(pattern, text, prefix, complete):
    import regex

    assert (regex.fullmatch(pattern, text, partial=True) is not None) is prefix
    assert (regex.fullmatch(pattern, text) is not None) is complete
    assert T.pattern_prefix_ok(pattern, text) is prefix
    assert T.pattern_complete_ok(pattern, text) is complete
    assert T.PatternInstance("patterns", 0, pattern).prefix_ok(text) is prefix


def test_a_backtracking_regex_check_raises_check_timeout():
    evil = r"^(a|aa)+$"  # exponential backtracking in the regex package
    text = "a" * 40 + "b"
    with pytest.raises(T.CheckTimeout):
        T.pattern_complete_ok(evil, text, timeout=0.05)
    assert T.pattern_score(evil, text, timeout=0.05) == T.Score(False, 0.0)
    with pytest.raises(ValueError, match="timeout"):
        T.pattern_prefix_ok("a", "a", timeout=0)


def test_time_bound_interrupts_slow_python_code():
    def spin():
        while True:
            pass

    start = time.process_time()
    with pytest.raises(T.CheckTimeout), T.time_bound(0.05):
        spin()
    assert time.process_time() - start < 1.0  # CPU seconds
    with T.time_bound(0.2):  # a fast block passes, and the timer is cleared afterwards
        x = sum(range(100))
    assert x == 4950
    end = time.process_time() + 0.4
    while time.process_time() < end:  # no stray signal fires past the bound
        pass
    with pytest.raises(ValueError, match="timeout"), T.time_bound(-1.0):
        pass


# ----------------------------------------------------------------------------- metrics


def test_molecule_metric_on_known_molecules():
    pytest.importorskip("rdkit")
    from rdkit import Chem
    from rdkit.Chem import QED

    aspirin = "CC(=O)Oc1ccccc1C(=O)O"
    valid, qed = T.molecule_score(" " + aspirin + " ")
    assert valid and qed == pytest.approx(QED.qed(Chem.MolFromSmiles(aspirin)))
    assert 0.5 < qed < 0.6  # aspirin's QED is 0.55
    assert T.molecule_score("c1cccc1") == T.Score(False, 0.0)  # parses only without kekulizing
    assert T.molecule_score("C1CC") == T.Score(False, 0.0)  # open ring
    assert T.molecule_score("") == T.Score(False, 0.0)
    assert T.MoleculeInstance("molecules", 0, ("C",)).score("CCO").valid


def test_pattern_metric_is_fullmatch():
    assert T.pattern_score(r"\d+", "123") == T.Score(True, 1.0)
    assert T.pattern_score(r"\d+", "123a") == T.Score(False, 0.0)
    assert T.pattern_score(r"\d+", "12") == T.Score(True, 1.0)


def test_posterior_score_weights_finished_particles_only():
    def score(text):
        return T.Score(text == "good", 1.0 if text == "good" else 0.0)

    particles = [
        T.Particle("good", 0.5, True),
        T.Particle("bad", 0.25, True),
        T.Particle("good", 0.25, False),  # cut at the token limit: left out
    ]
    s, v = T.posterior_score(particles, score)
    assert s == pytest.approx(0.5 / 0.75) and v == pytest.approx(0.5 / 0.75)
    assert T.posterior_score(particles, score, finished_only=False)[0] == pytest.approx(0.75)
    assert T.posterior_score([T.Particle("good", 1.0, False)], score) == (0.0, 0.0)
    assert T.posterior_score([], score) == (0.0, 0.0)


def test_bootstrap_interval_contains_the_mean_and_is_seeded():
    values = [0.1, 0.5, 0.4, 0.9, 0.3, 0.2, 0.7]
    mean, low, high = T.bootstrap_ci(values, seed=3)
    assert mean == pytest.approx(sum(values) / len(values))
    assert low < mean < high and min(values) <= low and high <= max(values)
    assert T.bootstrap_ci(values, seed=3) == (mean, low, high)
    assert T.bootstrap_ci([0.5, 0.5]) == (0.5, 0.5, 0.5)
    wide = T.bootstrap_ci(values, level=0.99, seed=3)
    assert wide[1] <= low and wide[2] >= high
    with pytest.raises(ValueError, match="non-empty"):
        T.bootstrap_ci([])
    with pytest.raises(ValueError, match="level"):
        T.bootstrap_ci(values, level=1.0)


# ----------------------------------------------------------------------------- records, report


def _record(**kw):
    base = dict(
        method="genlm-control AWRS-SMC",
        task="molecules",
        instance=3,
        replicate=1,
        n_particles=2,
        particles=[T.Particle(" CCO", 0.75, True), T.Particle(" CC(C", 0.25, False)],
        score=0.4,
        valid=1.0,
        predicate_calls=40,
        generated_tokens=20,
        cpu_seconds=12.5,
        wall_seconds=13.0,
        extra={"seed": 1234, "log_ml": -3.5},
    )
    base.update(kw)
    return T.RunRecord(**base)


def test_record_round_trips_through_a_jsonl_file(tmp_path):
    path = tmp_path / "runs.jsonl"
    first = _record()
    second = _record(replicate=2, particles=[], error="timeout: no result within 5 s", score=0.0)
    T.append_record(path, first)
    T.append_record(path, second)
    assert path.read_text().count("\n") == 2
    back = T.read_records(path)
    assert back == [first, second]
    assert back[0].particles[1] == T.Particle(" CC(C", 0.25, False)
    with pytest.raises(ValueError, match="task"):
        _record(task="proteins")
    with pytest.raises(ValueError, match="predicate_calls"):
        _record(predicate_calls=-1)


def test_report_has_one_row_per_method_with_its_figures(tmp_path, capsys):
    path = tmp_path / "runs.jsonl"
    for rep, (score, calls, cpu) in enumerate([(0.4, 40, 10.0), (0.6, 20, 30.0), (0.5, 60, 20.0)]):
        T.append_record(
            path, _record(replicate=rep, score=score, predicate_calls=calls, cpu_seconds=cpu)
        )
    T.append_record(path, _record(method="ours", score=0.0, valid=0.0, error="timeout"))
    rows = {r["method"]: r for r in T.summarize(T.read_records(path))}
    peer = rows["genlm-control AWRS-SMC"]
    assert peer["records"] == 3 and peer["score"] == pytest.approx(0.5)
    assert peer["score_low"] <= 0.5 <= peer["score_high"]
    assert peer["cpu_s"] == 20.0 and peer["calls_per_token"] == 2.0 and peer["errors"] == 0
    assert rows["ours"]["errors"] == 1 and rows["ours"]["timeouts"] == 1
    assert rows["ours"]["valid"] == 0.0 and peer["timeouts"] == 0
    T.main(["report", str(path)])
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].split()[:2] == ["task", "method"]
    assert any(line.startswith("molecules  genlm-control AWRS-SMC") for line in out)
    assert out[-1].startswith('{"awrs_report": [')
    assert math.isfinite(rows["ours"]["cpu_s"])


@needs_data  # the example draws a prompt from the shared file
def test_module_docstring_example_runs():
    pytest.importorskip("rdkit")
    import doctest

    result = doctest.testmod(T, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 5 and result.failed == 0
