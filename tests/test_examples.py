"""Smoke-run every script in ``examples/`` as a subprocess: ``--help``, then a fast run.

Fast arguments come from ``FAST_ARGS`` (keyed by file name). A script not listed
there gets ``--fast`` if its ``--help`` offers it, else the small values of
``FAST_FLAG_DEFAULTS`` for every flag its ``--help`` mentions.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from warning_policy import pythonwarnings

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

FAST_ARGS: dict[str, list[str]] = {
    "quickstart.py": ["--particles", "2", "--beam", "2", "--max-tokens", "4"],
    "hard_constraints.py": [
        "--particles",
        "2",
        "--beam",
        "2",
        "--max-tokens",
        "4",
        "--baseline-samples",
        "1",
    ],
    "infilling.py": ["--particles", "2", "--beam", "2", "--max-hole-tokens", "1"],
    "prompt_intersection.py": [],  # its defaults (~3 s of SMC): _prompt_intersection_claim
    "structured.py": ["--particles", "2", "--max-tokens", "16", "--samples", "1"],
}

FAST_FLAG_DEFAULTS: list[tuple[str, str]] = [
    ("--particles", "2"),
    ("--n-particles", "2"),
    ("--beam", "2"),
    ("--max-tokens", "4"),
    ("--max-new-tokens", "4"),
    ("--runs", "1"),
    ("--steps", "2"),
]

ENV = {
    **os.environ,
    "LLAMPPL_PROGRESS": "0",
    "PYTHONUNBUFFERED": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONWARNINGS": pythonwarnings(),  # a deprecated call of ours fails the example
}


def _run(script: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=script.parent.parent,
    )


# Runs every example's ``--help`` in ONE process (each script as ``__main__`` through ``runpy``,
# its exit caught): a process of its own per script paid the imports (~10 s) ten times over.
_HELP_ALL = """
import contextlib, io, json, runpy, sys, traceback
out = {}
for path in sys.argv[1:]:
    buf, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = [path, "--help"]
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:  # noqa: BLE001 - reported as the script's failure
            traceback.print_exc(file=err)
            code = 1
    out[path] = [code, buf.getvalue(), err.getvalue()]
sys.stdout.write(json.dumps(out))
"""


@functools.cache
def _all_help() -> dict[str, subprocess.CompletedProcess]:
    scripts = [str(p) for p in sorted(EXAMPLES.glob("*.py"))]
    done = subprocess.run(
        [sys.executable, "-c", _HELP_ALL, *scripts],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
        cwd=EXAMPLES.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    return {
        path: subprocess.CompletedProcess([path, "--help"], code, out, err)
        for path, (code, out, err) in found.items()
    }


def _help(script: Path) -> subprocess.CompletedProcess:
    """``script --help``, run once per session for every script (both tests below read it)."""
    return _all_help()[str(script)]


def option_help(help_text: str) -> dict[str, str]:
    """``--help`` output -> {option invocation: its help text} (whitespace collapsed)."""
    section = re.split(r"\n(?:options|optional arguments):\n", help_text, maxsplit=1)[1]
    out = {}
    for block in re.split(r"\n(?=  -)", section.rstrip()):
        parts = re.split(r"\s{2,}|\n", block.strip(), maxsplit=1)
        out[parts[0]] = " ".join(parts[1].split()) if len(parts) > 1 else ""
    return out


@pytest.mark.parametrize("script", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_every_option_has_help_and_its_default(script: Path):
    shown = _help(script)
    assert shown.returncode == 0, shown.stderr[-3000:]
    options = option_help(shown.stdout)
    assert len(options) > 2
    for invocation, text in options.items():
        if invocation.startswith("-h"):
            continue
        assert text and not text.startswith("(default"), f"{script.name}: {invocation} has no help"
        if " " in invocation:  # takes a value: its default is shown
            assert "(default: " in text, f"{script.name}: {invocation} hides its default"
    threads = [t for inv, t in options.items() if inv.startswith("--threads")]
    assert len(threads) <= 1 and all("(default: None)" in t for t in threads)


def fast_args(name: str, help_text: str) -> list[str]:
    if name in FAST_ARGS:
        return FAST_ARGS[name]
    flags = set(re.findall(r"--[a-z][a-z0-9-]*", help_text))
    if "--fast" in flags:
        return ["--fast"]
    return [x for flag, value in FAST_FLAG_DEFAULTS if flag in flags for x in (flag, value)]


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_example_runs(script: Path):
    shown = _help(script)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "usage" in shown.stdout.lower()
    done = _run(script, fast_args(script.name, shown.stdout), timeout=300)
    assert done.returncode == 0, (
        f"{script.name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    )
    assert done.stdout.strip(), f"{script.name} printed nothing"
    if script.name in CLAIMS:
        CLAIMS[script.name](done.stdout)


def _chat_claim(out: str) -> None:
    """No word of any reply has more Unicode letters than the limit."""
    longest, limit = map(
        int, re.search(r"longest word in any reply: (\d+) letters \(limit (\d+)\)", out).groups()
    )
    assert longest <= limit


def _prompt_intersection_claim(out: str) -> None:
    """Both formulations answer with words, and their top answer is neither prompt's own.

    Nearly all (>= 90%) of each formulation's weight is on answers that are words, its
    top answer is a word, and that answer differs from every prompt's greedy answer
    alone: the product of experts finds what fits both lists (" orange"), not what
    either list would say by itself (" grape", " green").
    """
    greedy = re.findall(r"greedy alone: ('.*?')  p=", out)
    word_weights = re.findall(r"weight on answers that are words: ([0-9.]+)", out)
    tops = re.findall(r"top answer: ('.*?')\n", out)
    assert len(greedy) == 2 and len(word_weights) == 2 and len(tops) == 2, out
    assert all(float(w) >= 0.9 for w in word_weights), out
    for top in tops:
        assert re.fullmatch(r"' ?[^\W\d_]{2,}(?:[ -][^\W\d_]+)*(?:\\n|[.!?])?'", top), top
        assert top not in greedy, (top, greedy)


def _hard_constraints_claim(out: str) -> None:
    """Every masked run reports its dead ends with the forbidden mass, never the allowed mass."""
    assert out.count("dead ends:") >= 2 and "stuck after" not in out


CLAIMS = {
    "chat.py": _chat_claim,
    "prompt_intersection.py": _prompt_intersection_claim,
    "hard_constraints.py": _hard_constraints_claim,
}
