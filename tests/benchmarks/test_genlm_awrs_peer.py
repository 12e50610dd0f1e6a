"""The genlm-control peer script (``benchmarks/peers/genlm_awrs.py``): the parts that need no genlm.

The script runs from ``.venv-genlm``; its module imports no genlm at the top, and llamppl only
for the tasks' checks (the library's constraints, the same on both sides), so its byte
decoding, its argument checks and its checks are tested here, from our venv.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peers" / "genlm_awrs.py"


def _load():
    spec = importlib.util.spec_from_file_location("genlm_awrs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


P = _load()


def test_decode_prefix_leaves_a_trailing_partial_character_for_the_next_token():
    assert P.decode_prefix(b"") == ""
    assert P.decode_prefix("CCé".encode()) == "CCé"
    assert P.decode_prefix(b"ab\xc3") == "ab"  # first byte of a 2-byte character
    assert P.decode_prefix("ab€".encode()[:-1]) == "ab"  # two of three bytes
    assert P.decode_prefix(b"a\xc3b") is None  # invalid in the middle
    assert P.decode_prefix(b"\xff") is None


def test_the_peer_imports_no_genlm_at_module_level_and_llamppl_only_for_constraints():
    lines = SCRIPT.read_text().splitlines()
    top = [x for x in lines if x.startswith(("import ", "from "))]
    assert top and not [x for x in top if "genlm" in x]
    ours = [x for x in top if x.split()[1].startswith("llamppl")]
    assert ours == ["from llamppl.constraints import CheckTimeout  # noqa: E402"]


def test_the_peers_checks_are_the_tasks_library_constraints():
    pytest.importorskip("partialsmiles")
    from llamppl.decoding.chemistry import Smiles
    from llamppl.decoding.text.characters import RegexPrefix

    mol, pattern = P.warmup_instance("molecules"), P.warmup_instance("patterns")
    assert isinstance(mol.constraint, Smiles) and isinstance(pattern.constraint, RegexPrefix)
    assert mol.prefix_ok(" CC(") and not mol.prefix_ok("C)") and mol.complete_ok(" CCO")
    assert pattern.prefix_ok("ab") and pattern.complete_ok("ab") and not pattern.prefix_ok("A")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--task", "molecules", "--instances", "0", "--out", "x.jsonl"], "--instances"),
        (["--task", "patterns", "--particles", "0", "--out", "x.jsonl"], "--particles"),
        (["--task", "patterns", "--timeout", "0", "--out", "x.jsonl"], "--timeout"),
        (["--task", "patterns", "--cpu-timeout", "-1", "--out", "x.jsonl"], "--cpu-timeout"),
        (["--task", "patterns", "--start-replicate", "3", "--out", "x.jsonl"], "--start-replicate"),
        (["--task", "patterns"], "--out is required"),
        (["--task", "proteins", "--out", "x.jsonl"], "invalid choice"),
    ],
)
def test_bad_arguments_fail_at_parse_time(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *argv])
    with pytest.raises(SystemExit) as stop:
        P.main()
    assert stop.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()


def test_the_script_runs_as_a_script(tmp_path):
    """Run as ``python genlm_awrs.py`` (its own sys.path set-up), it parses its arguments."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--task", "patterns"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "--out is required" in proc.stderr
