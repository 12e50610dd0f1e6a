"""``VLLMLM`` on a real vLLM engine (the CPU build) serving the embedded SmolLM2, both modes.

Runs only where vLLM is importable: from ``.venv-vllm`` (``bash scripts/setup-vllm.sh``;
``scripts/test.sh`` does this after the main suite)::

    .venv-vllm/bin/python -m pytest -q -m vllm tests/lm/test_vllm_lm.py

One engine per module (in process, fp32, 1 GiB of K/V, ~10 s to start); the tests wrap
it in ``VLLMLM`` objects of either mode (``live=True``: particles as live requests).
"""

from __future__ import annotations

import asyncio
import os
import re
from types import SimpleNamespace

import pytest
import torch

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of K/V cache on a CPU box
os.environ.setdefault("HF_HUB_OFFLINE", "1")
vllm = pytest.importorskip(
    "vllm", reason="vLLM is not installed here; run from .venv-vllm (scripts/setup-vllm.sh)"
)

from llamppl import LMContext, Model  # noqa: E402
from llamppl.inference import smc_standard, smc_steer  # noqa: E402
from llamppl.lm.hf.embedded import converted_dir  # noqa: E402
from llamppl.lm.vllm.lm import VLLMLM  # noqa: E402

# fp32 on both sides. The two engines compute the same function with different kernels
# (vLLM's fused CPU attention/RMSNorm vs PyTorch SDPA) so they differ by float32 round-off:
# measured max |Δ log p| 4.8e-5 over 49,152 entries (at most 8.2e-5 against transformers),
# the same order as CachedCausalLM's own 1e-4 contract against a fresh forward. A bug
# (wrong row, wrong position, unnormalised logits) gives errors of order 1 or more.
TOL = 2e-4


@pytest.fixture(scope="module")
def vlm() -> VLLMLM:
    torch.set_num_threads(1)
    return VLLMLM.from_pretrained(converted_dir(), dtype="float32", max_model_len=512)


@pytest.fixture(scope="module")
def make_lm():
    """``CachedCausalLM`` factory on the float32 weights the engine serves (the CPU default's
    float16-weight layers differ from them by about 1e-2 in log-probs)."""
    from llamppl import CachedCausalLM

    ref = CachedCausalLM.default(weights="fp32")

    def make(**kw):
        return CachedCausalLM(ref.model, ref.tokenizer, **kw)

    return make


class NoLongWords(Model):
    """The quickstart model (examples/quickstart.py): no word longer than five letters."""

    def __init__(self, lm, prompt: str, max_tokens: int = 8) -> None:
        super().__init__()
        self.context = LMContext(lm, prompt)
        self.max_tokens = max_tokens

    async def step(self) -> None:
        token = await self.sample(self.context.next_token())
        self.condition(all(len(w) <= 5 for w in re.findall(r"[A-Za-z]+", str(self.context))))
        if token == self.context.lm.eos_token_id or len(self.context.generated) >= self.max_tokens:
            self.finish()


def gather(lm, contexts, method="next_token_logprobs"):
    """``lm.<method>(c)`` for every context, awaited together (one coalesced round)."""

    async def go():
        return await asyncio.gather(*(getattr(lm, method)(c) for c in contexts))

    return asyncio.run(go())


@pytest.mark.parametrize("live", [True, False])
def test_logprobs_match_cached_causal_lm(vlm, make_lm, live):
    vlm = VLLMLM(vlm.llm, capture="processor", live=live)
    hf = make_lm()
    assert vlm.vocab_size == hf.vocab_size and vlm.vocab == hf.vocab
    assert vlm.eos_token_id == hf.eos_token_id and vlm.bos_token_id == hf.bos_token_id
    prompt = vlm.encode("In a small village by the sea, an old fisherman")
    contexts = [prompt] + [prompt + [t, 17 + t] for t in (11, 2000, 30000, 49100)]
    got, want = gather(vlm, contexts), gather(hf, contexts)
    assert vlm.batch_calls == 1  # one round
    if live:  # the prompt first, then four requests forked from it: 2 tokens each
        assert vlm.stats.engine_calls == 2 and vlm.stats.forks == 4
        assert vlm.stats.tokens_computed == len(prompt) + 4 * 2
    else:  # one generate call, five requests
        assert vlm.stats.engine_calls == 1
    for g, w in zip(got, want):
        assert g.dtype == torch.float32 and g.shape == (vlm.vocab_size,) and g.device == vlm.device
        assert (g - w).abs().max().item() < TOL
        # normalised: float32 log_softmax over 49,152 entries sums to 1 within ~1e-5 (measured 1.6e-5)
        assert abs(torch.logsumexp(g.double(), 0).item()) < 1e-4
    # the documented output path (logprobs=-1) on the same engine gives the same rows
    via_outputs = VLLMLM(vlm.llm, capture="logprobs", live=live)
    for g, o in zip(got, gather(via_outputs, contexts)):
        assert (g - o).abs().max().item() < 1e-6


def test_prefix_cache_serves_a_shared_prompt(vlm):
    vlm = VLLMLM(vlm.llm, capture="processor", live=False)
    prompt = vlm.encode(" ".join(["The quick brown fox jumps over the lazy dog."] * 8))
    assert len(prompt) >= 64
    vlm.clear_cache()
    vlm.stats.reset()
    gather(vlm, [prompt + [5]])
    first = vlm.stats.tokens_computed
    gather(vlm, [prompt + [t] for t in range(6, 22)])  # 16 continuations of the cached prompt
    assert first == len(prompt) + 1
    # vLLM caches whole 32-token blocks: each continuation reuses the prompt's full blocks
    blocks = (len(prompt) // 32) * 32
    assert vlm.stats.prefix_cached_tokens == 16 * blocks
    assert vlm.stats.tokens_computed == first + 16 * (len(prompt) + 1 - blocks)


@pytest.mark.parametrize("live", [True, False])
def test_smc_standard_quickstart_one_engine_call_per_step(vlm, live):
    vlm = VLLMLM(vlm.llm, capture="processor", live=live)
    calls0 = vlm.batch_calls
    result = asyncio.run(smc_standard(NoLongWords(vlm, "The Fed says"), 8, seed=0))
    steps = result.stats["steps"]
    assert 1 <= steps <= 8 and len(result.particles) == 8
    assert vlm.stats.engine_calls == vlm.batch_calls - calls0 == steps
    assert result.stats["forward_calls"] == steps
    for p, w in zip(result.particles, result.weights):
        if w > 0:
            assert all(len(x) <= 5 for x in re.findall(r"[A-Za-z]+", str(p.context)))


def test_capture_processor_follows_vllm_batch_updates():
    """The logits processor keeps row -> tag through vLLM's removed / added / moved updates."""
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    from llamppl.lm.vllm import port as vllm_port

    proc = vllm_port.processor_class()(None, torch.device("cpu"), False)
    tagged = lambda t: vllm.SamplingParams(extra_args={vllm_port.CAPTURE_TAG: t})  # noqa: E731
    plain = vllm.SamplingParams()
    proc.update_state(
        BatchUpdate(
            4,
            [],
            [
                (0, tagged("a"), [1], []),
                (1, plain, [1], []),
                (2, tagged("b"), [1], []),
                (3, tagged("c"), [1], []),
            ],
            [],
        )
    )
    # row 1 finishes and row 3 moves into its place (condensing); rows 0 and 2 swap
    proc.update_state(
        BatchUpdate(
            3,
            [1],
            [],
            [(3, 1, MoveDirectionality.UNIDIRECTIONAL), (0, 2, MoveDirectionality.SWAP)],
        )
    )
    proc.update_state(BatchUpdate(4, [], [(3, plain, [1], [])], []))  # untagged request in row 3
    assert proc.tags == {0: "b", 1: "c", 2: "a"}
    # the model's compute_logits, wrapped once however often it is asked, keeps its input
    model = SimpleNamespace(compute_logits=lambda h: h @ torch.randn(5, 7))
    llm = SimpleNamespace(apply_model=lambda fn: [fn(model)])
    assert vllm_port.install_hidden_capture(llm) is None
    assert vllm_port.install_hidden_capture(llm) is None
    hidden = torch.randn(4, 5)
    logits = model.compute_logits(hidden)
    assert proc.apply(logits) is logits  # logits pass through unchanged
    try:
        rows = vllm_port.captured_rows(["a", "b", "c"])
        states = vllm_port.captured_hidden(["a", "b", "c"])
        for row, tag in proc.tags.items():
            assert torch.equal(rows["abc".index(tag)], torch.log_softmax(logits[row], -1))
            assert torch.equal(states["abc".index(tag)], hidden[row])
        # one (3, V) and one (3, D) tensor for the step: the rows are views of them
        assert len({r.untyped_storage().data_ptr() for r in rows}) == 1
        assert len({h.untyped_storage().data_ptr() for h in states}) == 1
        proc.apply(logits)  # a step whose compute_logits was not wrapped: no stale hidden
        assert vllm_port.captured_hidden(["a"]) == [None]
    finally:
        vllm_port.forget_captured(["a", "b", "c"])
    assert "apply_model" in vllm_port.install_hidden_capture(SimpleNamespace())
    no_head = SimpleNamespace(apply_model=lambda fn: [fn(SimpleNamespace())])
    assert "no compute_logits" in vllm_port.install_hidden_capture(no_head)


# ---------------------------------------------------------------------- live requests
def scheduler(vlm):
    return vlm.llm.llm_engine.engine_core.engine_core.scheduler  # the in-process engine's


def test_live_forks_load_their_ancestor_and_dead_particles_are_freed(vlm, make_lm):
    hf = make_lm()
    lm = VLLMLM(vlm.llm, capture="processor", live=True)
    prompt = vlm.encode(" ".join(["The quick brown fox jumps over the lazy dog."] * 4))
    assert len(prompt) % 32 != 0  # the prompt ends inside a partial block
    gather(lm, [prompt])
    assert lm.stats.tokens_computed <= len(prompt)  # (a full block may be prefix-cached)
    lm.stats.reset()
    kids = [prompt + [t] for t in (11, 2000, 30000, 49100)]
    rows = gather(lm, kids)
    # one child extends the prompt's request, three fork from it and load its K/V:
    # the engine runs ONE token per child, in one step
    assert (lm.stats.extends, lm.stats.forks, lm.stats.engine_calls) == (1, 3, 1)
    assert lm.stats.tokens_computed == 4
    for g, w in zip(rows, gather(hf, kids)):
        assert (g - w).abs().max().item() < TOL
    mine = lambda: {r for r in scheduler(vlm).requests if r.startswith(lm._tag_prefix)}  # noqa: E731
    assert len(mine()) == 4
    lm.stats.reset()
    grand = [kids[0] + [13], kids[0] + [14], kids[2] + [15]]  # kids 1 and 3 died
    rows = gather(lm, grand)
    assert lm.stats.freed == 2 and len(mine()) == 3  # freed at the end of the round
    assert lm.stats.tokens_computed == 3 and lm.stats.engine_calls == 1
    for g, w in zip(rows, gather(hf, grand)):
        assert (g - w).abs().max().item() < TOL
    lm.release()
    assert not mine()


class Counting(NoLongWords):
    """The quickstart model, recording the distinct contexts read at every step."""

    seen: list[set] = []

    async def step(self) -> None:
        n = len(self.context.generated)
        while len(Counting.seen) <= n:
            Counting.seen.append(set())
        Counting.seen[n].add(tuple(self.context.tokens))
        await super().step()


def test_live_smc_steer_runs_one_token_per_distinct_context_and_step(vlm, make_lm):
    lm = VLLMLM(vlm.llm, capture="processor", live=True)
    Counting.seen = []
    result = asyncio.run(smc_steer(Counting(lm, "The Fed says", max_tokens=10), 8, 3, seed=0))
    distinct = [len(s) for s in Counting.seen]
    prompt = len(next(iter(Counting.seen[0])))
    assert lm.stats.engine_calls == result.stats["steps"] == len(distinct)
    assert lm.stats.tokens_computed == prompt + sum(distinct[1:])  # the trie's minimum
    hf = make_lm()
    trie = asyncio.run(smc_steer(NoLongWords(hf, "The Fed says", max_tokens=10), 8, 3, seed=0))
    assert lm.stats.tokens_computed <= 1.1 * trie.stats["tokens_run"]
    lm.release()


def _same_run(live, trie) -> None:
    assert [str(p) for p in live.particles] == [str(p) for p in trie.particles]
    assert live.log_ml == pytest.approx(trie.log_ml, abs=1e-3)


def test_live_library_programs_run_unchanged(vlm, make_lm):
    """HardConstraint, generate_json and power_smc give the trie's runs on live requests."""
    from llamppl.constraints import max_word_length
    from llamppl.models import HardConstraint, generate_json, power_smc

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    runs = {
        "hard": lambda lm: asyncio.run(
            smc_standard(
                HardConstraint(lm, "The Fed says", max_word_length(5), max_tokens=8), 6, seed=1
            )
        ),
        "json": lambda lm: (
            generate_json(
                lm, "Maria Lopez, 34. As JSON:", schema, n_particles=3, seed=0, max_tokens=20
            ).result
        ),
        "power": lambda lm: (
            asyncio.run(
                power_smc(lm, "The Fed says", alpha=2.0, n_particles=6, max_tokens=6, seed=0)
            ).result
        ),
    }
    for name, go in runs.items():
        lm, hf = VLLMLM(vlm.llm, capture="processor", live=True), make_lm()
        live, trie = go(lm), go(hf)
        _same_run(live, trie)
        assert lm.stats.tokens_computed <= 1.1 * hf.stats.tokens_run, name
        lm.release()


def test_live_host_syncs_per_step_do_not_grow_with_n(vlm):
    from tests.core.test_host_syncs import syncs_per_step

    eos = min(vlm.eos_token_ids)
    counts = {}
    for n in (2, 8, 32):
        lm = VLLMLM(vlm.llm, capture="processor", live=True)
        counts[n] = syncs_per_step(lm, n, steps=3, eos=eos, observed=11)
        lm.release()
    assert counts[2] == counts[8] == counts[32], counts


def test_live_llamppl_and_hfppl_forms_run_unchanged(vlm, tmp_path, monkeypatch):
    """The peers' program forms (tests/compat/test_peer_forms.py), LLM = a live VLLMLM."""
    from hfppl import smc_steer as h_smc_steer
    from tests.compat.test_peer_forms import FewLetters, NoE

    monkeypatch.chdir(tmp_path)
    LLM = VLLMLM(vlm.llm, capture="processor", live=True)  # noqa: N806
    assert LLM.backend == "vllm"
    LLM.cache_kv(LLM.tokenizer.encode("The sky"))
    particles = asyncio.run(
        smc_standard(FewLetters(LLM, "The sky", 3), 3, 0.5, "html", "results/output.json")
    )
    assert len(particles) == 3 and (tmp_path / "results" / "output.json").exists()
    for p in particles:
        if p.weight > float("-inf"):
            assert all(t in p.allowed for t in p.context.generated if t != p.eos_token_id)
    # start + 3 steps read 4 rounds; each live particle computes one token per round
    assert LLM.stats.engine_calls <= LLM.batch_calls + 1
    assert LLM.stats.tokens_computed <= len(LLM.encode("The sky")) + 3 * 3
    particles = asyncio.run(h_smc_steer(NoE(LLM, "The weather today is", "e"), 2, 2))
    assert 1 <= len(particles) <= 2
    for particle in particles:
        assert "e" not in particle.context.s
    LLM.release()


def test_live_many_problems_share_one_engine(vlm):
    """``run_many`` in this process on a live VLLMLM: the particles of all running problems are
    live requests of one engine, served in one engine call per round; each problem gives its
    run alone (particles; log Ẑ up to vLLM's batch round-off)."""
    from llamppl.constraints import max_word_length
    from llamppl.distributed import Job, run_job, run_many
    from llamppl.models import HardConstraint, generate_json_async, power_smc

    def hard(lm, prompt):
        return HardConstraint(lm, prompt, max_word_length(5), max_tokens=8)

    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    jobs = [
        Job(hard, ("The Fed says",), 1, options={"n_particles": 6}),
        Job(hard, ("My cat",), 2, options={"n_particles": 6}),
        Job.call(power_smc, "Once upon", alpha=2.0, n_particles=6, max_tokens=6, seed=0),
        Job.call(
            generate_json_async, "Tom, 34. As JSON:", schema, n_particles=3, max_tokens=12, seed=0
        ),
    ]
    alone = []
    for i, job in enumerate(jobs):
        lm = VLLMLM(vlm.llm, capture="processor", live=True)
        alone.append((run_job(job, lm, i), lm.stats.engine_calls))
        lm.release()
    lm = VLLMLM(vlm.llm, capture="processor", live=True)
    together = run_many(jobs, lm, concurrency=len(jobs), progress=False)
    for got, (one, _) in zip(together, alone):
        assert got.ok and one.ok, (got.error, one.error)
        assert got.particles == one.particles
        assert got.log_ml == pytest.approx(one.log_ml, abs=1e-3)
    # an engine call serves every running problem's live requests: far fewer calls
    assert lm.stats.engine_calls <= 0.6 * sum(calls for _, calls in alone)
    lm.release()


# ---------------------------------------------------------------------- hidden states
def hidden_of(lm, contexts):
    return gather(lm, contexts, "next_token_hidden")


@pytest.mark.parametrize("live", [True, False])
def test_hidden_states_match_cached_causal_lm_and_give_the_served_logprobs(vlm, make_lm, live):
    lm, hf = VLLMLM(vlm.llm, capture="processor", live=live), make_lm()
    assert lm.hidden_size == hf.hidden_size
    prompt = lm.encode("In a small village by the sea, an old fisherman")
    kids = [prompt + [t] for t in (11, 2000, 30000)]
    # live=True: the prompt's request, extended for one kid and forked for two; that kid's
    # extended by two tokens; a new request (the prompt's blocks prefix-cached)
    rounds = [[prompt], kids, [kids[0] + [17, 18]], [prompt + [5, 6, 7]]]
    for contexts in rounds:
        rows = gather(lm, contexts)
        got, want = hidden_of(lm, contexts), hidden_of(hf, contexts)
        for c, g, w, row in zip(contexts, got, want, rows):
            assert g.dtype == torch.float32 and g.shape == (lm.hidden_size,)
            # fp32 on both sides, different kernels (as TOL): measured max |Δh| 3.4e-5 on
            # entries up to 50 (the final norm's output), at most 1.7e-6 of max |h|; a wrong
            # row, position or step gives a difference of the order of |h| itself
            assert (g - w).abs().max().item() < 1e-5 * w.abs().max().item(), len(c)
            with torch.inference_mode():  # the head on it gives the served row (measured 5e-5)
                again = hf._logprobs_from_hidden(g[None])[0]
            assert (again - row).abs().max().item() < TOL
    if live:
        assert lm.stats.forks == 2 and lm.stats.extends == 2
    lm.release()


@pytest.mark.parametrize("live", [True, False])
def test_hidden_state_of_a_served_context_costs_no_engine_call(vlm, live):
    lm = VLLMLM(vlm.llm, capture="processor", live=live)
    prompt = lm.encode("The Fed says")
    contexts = [prompt + [t] for t in (11, 2000, 30000)]
    gather(lm, contexts)
    calls = lm.stats.engine_calls
    hidden = hidden_of(lm, contexts)
    assert lm.stats.engine_calls == calls  # read beside the served log-probs
    assert all(h.shape == (lm.hidden_size,) for h in hidden)
    # new contexts: their share of ONE engine step, and their log-probs are served with it
    new = [c + [5] for c in contexts]
    hidden_of(lm, new)
    assert lm.stats.engine_calls == calls + 1
    gather(lm, new)
    assert lm.stats.engine_calls == calls + 1
    lm.release()
    with pytest.raises(TypeError, match="capture='processor'"):
        asyncio.run(VLLMLM(vlm.llm, capture="logprobs").next_token_hidden(prompt))


def test_learned_twist_reads_the_hidden_state_from_vllm(vlm, make_lm):
    from llamppl.inference.twist_features import TwistFeatures, hidden_state, progress
    from llamppl.inference.twist_learning import LearnedTwist, fit_head

    lm, hf = VLLMLM(vlm.llm, capture="processor", live=True), make_lm()
    features = TwistFeatures(hidden_state(), progress())
    dim = lm.hidden_size + 3
    twist = LearnedTwist(features, *fit_head(torch.randn(16, dim), torch.arange(16) % 2, epochs=5))
    model = NoLongWords(lm, "The Fed says")
    x = asyncio.run(features(model))
    assert x.shape == (dim,) and lm.stats.engine_calls == 1
    asyncio.run(model.context.lm.next_token_logprobs(model.context.tokens))
    assert lm.stats.engine_calls == 1  # the next step's log-probs came with the hidden state
    want = asyncio.run(twist(NoLongWords(hf, "The Fed says")))
    assert asyncio.run(twist(model)) == pytest.approx(want, abs=1e-3)
    lm.release()
