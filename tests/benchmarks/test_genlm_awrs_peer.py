"""The genlm-control peer script (``benchmarks/peers/genlm_awrs.py``): the parts that need no genlm.

The script runs from ``.venv-genlm``; its module imports neither genlm nor llamppl at the top,
so its byte decoding and its argument checks are tested here, from our venv.
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


def test_the_peer_never_imports_llamppl_or_genlm_at_module_level():
    lines = SCRIPT.read_text().splitlines()
    imports = [x.strip() for x in lines if x.strip().startswith(("import ", "from "))]
    assert imports and not [x for x in imports if x.split()[1].startswith("llamppl")]
    top = [x for x in lines if x.startswith(("import ", "from "))]
    assert not [x for x in top if "genlm" in x]


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
def test_bad_arguments_fail_at_parse_time(argv, message, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 2 and message in proc.stderr
    assert not (tmp_path / "x.jsonl").exists()
