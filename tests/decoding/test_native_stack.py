"""llguidance work that recurses per ``$ref`` hop runs on a large stack, off the hot path.

llguidance compiles a JSON Schema again when a matcher is built from it (and when a Lark
grammar embedding one is validated), recursing about 8 KB of native stack per reference
hop: on the caller's default stack a 1,000-deep chain is a segfault. The chain must
compile, build a matcher, copy it, mask with it and advance it to an accepting state (in
a subprocess: a crash would kill pytest). Only the first matcher of a (grammar, LM) is
built on a worker of :mod:`llamppl.decoding.grammar.native_stack`; later ones copy it on the
caller's thread. The workers are kept: one after another, calls run on the same thread,
and a call nobody waits for any more runs to its end and frees its worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

pytest.importorskip("llguidance", reason="needs llguidance (dev extra)")
pytest.importorskip("jsonschema")

from llamppl import FunctionLM  # noqa: E402
from llamppl.decoding.grammar import matcher as grammar_matcher  # noqa: E402
from llamppl.decoding.grammar.compile import json_grammar  # noqa: E402
from llamppl.decoding.grammar.matcher import MatcherState  # noqa: E402
from llamppl.decoding.grammar.native_stack import NativeCall, on_native_stack  # noqa: E402

DEEP_CHAIN = textwrap.dedent(
    """
    import copy, json
    from llamppl import FunctionLM
    from llamppl.decoding.grammar.compile import Grammar, json_grammar
    from llamppl.decoding.grammar.engine import MatcherState, allowed_masks

    defs = {
        f"d{i}": {
            "type": "object",
            "properties": {"s": {"type": "string"}, "next": {"$ref": f"#/$defs/d{i + 1}"}},
        }
        for i in range(999)
    }
    defs["d999"] = {"type": "string"}
    schema = {"$defs": defs, "$ref": "#/$defs/d0"}
    text = '{"s":"a","next":{"s":"b","next":{"s":"c"}}}'
    vocab = ["<s>", *sorted(set(text)), "<eos>"]
    lm = FunctionLM(vocab, len(vocab) - 1, lambda ctx: [0.0] * len(vocab), bos_token_id=0)
    for grammar in (
        json_grammar(schema, compile_timeout=None),
        Grammar.from_lark("start: %json " + json.dumps(schema)),
    ):
        state = MatcherState(lm, grammar)  # built on the caller's (main) thread
        clone = copy.deepcopy(state)
        for char in text:
            token = vocab.index(char)
            assert bool(allowed_masks(lm, [state])[0, token]), char
            assert state.consume(token), char
        assert state.accepting and not clone.accepting
        assert MatcherState(lm, grammar).consume(vocab.index("{"))
    print("ok")
    """
)


def test_a_thousand_deep_reference_chain_builds_copies_masks_and_advances_a_matcher():
    done = subprocess.run(
        [sys.executable, "-c", DEEP_CHAIN], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "ok"


def test_on_native_stack_returns_raises_and_nests_as_a_plain_call():
    caller = threading.get_ident()
    seen: list[int] = []

    def inner() -> int:
        seen.append(threading.get_ident())
        return 7

    def outer() -> int:
        seen.append(threading.get_ident())
        return on_native_stack(inner) + 1  # already on a large stack: no new thread

    assert on_native_stack(outer) == 8
    assert seen[0] == seen[1] != caller

    def fails() -> None:
        raise KeyError("from the worker")

    with pytest.raises(KeyError, match="from the worker"):
        on_native_stack(fails)


def test_kept_workers_serve_calls_one_after_another_and_outlive_abandoned_calls():
    threads = {on_native_stack(threading.get_ident) for _ in range(5)}
    assert len(threads) == 1  # one kept worker
    release = threading.Event()
    slow = NativeCall(lambda: release.wait(10.0) and "late", name="llamppl-test-call")
    assert not slow.wait(0.05)  # the caller may give up here
    assert "llamppl-test-call" in {t.name for t in threading.enumerate()}  # still running
    with pytest.raises(RuntimeError, match="not finished"):
        slow.result()
    assert on_native_stack(threading.get_ident) not in threads  # the busy worker is not used
    release.set()
    assert slow.wait(10.0) and slow.result() == "late"
    assert "llamppl-test-call" not in {t.name for t in threading.enumerate()}


FORK = textwrap.dedent(
    """
    import os, signal
    from llamppl.decoding.grammar.native_stack import on_native_stack

    assert on_native_stack(lambda: 1) == 1  # a kept worker in the parent
    child = os.fork()
    if child == 0:  # the parent's worker does not exist here: a new one serves
        signal.alarm(30)  # a child left waiting for the parent's worker ends anyway
        os._exit(0 if on_native_stack(lambda: 2) == 2 else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert on_native_stack(lambda: 3) == 3
    print("ok")
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_gets_its_own_workers():
    done = subprocess.run([sys.executable, "-c", FORK], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_only_the_first_matcher_of_a_grammar_and_lm_is_built_on_the_native_stack(monkeypatch):
    grammar = json_grammar({"type": "object", "properties": {"a": {"type": "integer"}}})
    vocab = ["<s>", "{", "}", '"a":', "1", "<eos>"]
    lm = FunctionLM(vocab, len(vocab) - 1, lambda ctx: [0.0] * len(vocab), bos_token_id=0)
    calls: list[int] = []

    def counted(work):
        calls.append(threading.get_ident())
        return on_native_stack(work)

    monkeypatch.setattr(grammar_matcher, "on_native_stack", counted)
    first = MatcherState(lm, grammar)
    assert len(calls) == 1  # the template: a cache miss
    for _ in range(3):
        MatcherState(lm, grammar)  # per particle: a copy of the kept template
    assert len(calls) == 1
    assert first.consume(1) and first.consume(3) and first.consume(4) and first.consume(2)
    assert first.accepting
