r"""Learned twists: fit log ψ_θ(prefix) from a program's own runs, save it, use it.

Twisted SMC (Zhao et al., ICML 2024, arXiv 2404.17546; ``papers.md`` §6) targets
π_t(s_{1:t}) ∝ p₀(s_{1:t}) ψ_t(s_{1:t}) with ψ_T = φ. Its optimal twist is

    ψ*_t(s_{1:t}) = E[φ(s_{1:T}) | s_{1:t}],

and Z stays unbiased for *any* positive ψ_1..ψ_{T-1} because the twists telescope: a program
adds ``log ψ_t − log ψ_{t-1}`` at step t (``Model.twist``) and divides the last one out when
the particle ends (``Model.untwist``), so the final weight is the untwisted one. A learned
twist therefore changes only where SMC spends its particles, never what it targets.

**What is fitted.** :func:`learn_twist` runs the program (built by ``make_model(lm, prompt,
twist)``) with SMC on training prompts. At every step the twist it was given records the
particle's features x_t (:mod:`~llamppl.inference.twist_features`) on the particle; when the
run ends, every final particle's recorded prefixes get its outcome y = 1 (success: by default
finished with positive weight) or 0. The head is the logistic regression (or a one-hidden-layer
MLP) f_θ minimising the held-out-checked cross-entropy

    L(θ) = − Σ_{(x, y)} [ y log σ(f_θ(x)) + (1 − y) log(1 − σ(f_θ(x))) ] + λ ‖θ‖²,

whose minimiser over all functions is σ(f_θ(x)) = E[y | x] (cross-entropy is a proper
scoring rule, also for labels y in [0, 1]). Two labels (``target=``):

- ``"success"``: y = φ, the final particle's outcome. Then σ(f_θ) = P(φ = 1 | prefix): the
  probability that a prefix ends well *under the sampler that produced it*, i.e. ψ*_t =
  E[φ | s_{1:t}] with the expectation under the program's own proposal and resampling
  rather than p₀. It is what resampling needs to keep particles that will still end
  (a valid molecule within the token budget), and it has labels wherever SMC finds any.
- ``"weight"``: y = φ · ∏_{s>t} G_s, the untwisted weight the particle gains after step t
  (clipped to 1; potentials G ≤ 1, such as HardConstraint's allowed masses, never clip).
  With independent runs (``ess_threshold=0``) the particle's future is drawn from the
  proposal q, and E_q[φ ∏_{s>t} G_s | s_{1:t}] = E_{p₀}[φ | s_{1:t}] = ψ*_t exactly, the
  zero-variance twist of Twisted SMC (for the program's target: p₀ ∏ G).

Both are plain regressions instead of the contrastive gradient E_σ[∇ log ψ] − E_{π_t}[∇ log
ψ], which needs approximate target samples the program cannot produce before it works. The
head's error costs efficiency only: exactness holds for every positive twist. The twist is

    log ψ_θ(s_{1:t}) = clip(log σ(f_θ(x_t)), −clip, 0)        (positive, finite)

(:meth:`LearnedTwist.sharpened` gives ψ_θ^a, a > 0, a twist as valid as ψ_θ.)

(``rounds > 1`` re-runs the program under the twist learned so far and refits on all data,
so the head also sees the prefixes its own twist makes SMC keep.)

**When the fit cannot help, it says so.** A head is only as good as the contrast in its
labels. If (nearly) every rollout succeeds, every ``"success"`` label is 1 and the best head
is the constant ψ = 1, which is no twist at all; a fitted head is then at best useless and,
penalised and fitted for finitely many epochs, slightly worse than the constant on held-out
prefixes. :func:`learn_twist` therefore warns (``UserWarning``, also kept on
``report.warnings``) when

- the training labels carry no signal: their variance is below :data:`FLAT_LABELS` (0.01;
  for 0/1 labels, fewer than about 1 prefix in 100 on one side), and
- the head is no better than a constant on held-out prefixes: its held-out cross-entropy is
  not below that of the training success rate,

each time naming what to change (another ``target``, prompts or settings under which some
runs fail or succeed, more or other prompts, other features).

Use it in any program through ``Model.twist`` (:meth:`LearnedTwist.retwist` sets the
particle's outstanding twist to log ψ of its prefix), or pass it to
:class:`~llamppl.models.HardConstraint` as ``twist=``::

    from llamppl.inference.twist_learning import learn_twist, LearnedTwist
    from llamppl.inference.twist_features import TwistFeatures, hidden_state, progress
    make = lambda lm, prompt, twist: HardConstraint(lm, prompt, smiles(), twist=twist)
    learned = learn_twist(make, lm, train_prompts, TwistFeatures(hidden_state(), progress()))
    learned.save("molecules.pt"); learned = LearnedTwist.load("molecules.pt")
    result = run(smc_standard(make(lm, prompt, learned), 5, seed=0))
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from llamppl.modeling import Model
from llamppl.runner import run

from .learned_twist import LearnedTwist, TrainingReport, head_module
from .smc_standard import smc_standard
from .twist_features import TwistFeatures

__all__ = ["LearnedTwist", "TARGETS", "FLAT_LABELS", "TrainingReport", "learn_twist", "fit_head"]

#: What a recorded prefix is labelled with (module docstring, "What is fitted").
TARGETS = ("success", "weight")

#: Training labels whose variance is below this carry no signal to fit (module docstring,
#: "When the fit cannot help"): for 0/1 labels, fewer than about 1 in 100 on one side.
FLAT_LABELS = 0.01

#: Where a particle keeps the features its recording twist saw (an immutable linked list).
_TRACE = "_twist_trace"


class _Trace:
    """One recorded prefix and its parent: clones share the past, so copying is free."""

    __slots__ = ("x", "log_w", "parent", "length")

    def __init__(self, x: torch.Tensor, log_w: float, parent: _Trace | None) -> None:
        self.x, self.log_w, self.parent = x, log_w, parent
        self.length = 1 + (parent.length if parent is not None else 0)

    def __deepcopy__(self, memo: dict) -> _Trace:
        return self

    def rows(self) -> list[tuple[torch.Tensor, float]]:
        """``(features, untwisted log weight)`` of each recorded prefix, first to last."""
        out, node = [], self
        while node is not None:
            out.append((node.x, node.log_w))
            node = node.parent
        return out[::-1]


class _Recorder:
    """The twist :func:`learn_twist` hands the program: it records each particle's features
    on the particle and twists by the current head (0 when there is none yet)."""

    def __init__(self, features: TwistFeatures, current: LearnedTwist | None) -> None:
        self.features, self.current = features, current

    async def __call__(self, model: Model) -> float:
        x = await self.features(model)
        untwisted = model.weight - model.twist_amount  # log ∏_{s<=t} G_s, twists taken out
        setattr(model, _TRACE, _Trace(x, untwisted, getattr(model, _TRACE, None)))
        return 0.0 if self.current is None else float(self.current.log_psi_of(x))

    async def retwist(self, model: Model) -> float:
        level = await self(model)
        if level != model.twist_amount:
            model.twist(level - model.twist_amount)
        return level

    def __deepcopy__(self, memo: dict) -> _Recorder:
        return self


def _label(target: str, ok: bool, final_log_w: float, log_w: float) -> float:
    """The regression target of one recorded prefix (module docstring, "What is fitted")."""
    if not ok:
        return 0.0
    if target == "success":
        return 1.0
    return float(min(1.0, math.exp(min(final_log_w - log_w, 0.0))))  # φ ∏_{s>t} G_s, clipped


def _succeeded(model: Model) -> bool:
    return bool(model.finished and model.weight > -math.inf)


def _bce(logit: torch.Tensor, y: torch.Tensor) -> float:
    return float(torch.nn.functional.binary_cross_entropy_with_logits(logit, y))


def fit_head(
    x: torch.Tensor,
    y: torch.Tensor,
    hidden: int = 0,
    l2: float = 1e-3,
    epochs: int = 300,
    seed: int = 0,
) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """Fit f_θ by full-batch Adam on the penalised cross-entropy (module docstring).

    ``x`` ``(n, D)`` features, ``y`` ``(n,)`` in {0, 1}. Returns ``(head, mean, std)``: the head
    reads ``(x − mean) / std`` (constant features get std 1).
    """
    x, y = x.float(), y.float()
    mean = x.mean(0)
    std = x.std(0, unbiased=False)
    std = torch.where(std > 1e-6, std, torch.ones_like(std))
    z = (x - mean) / std  # (n, D)
    gen = torch.Generator().manual_seed(seed)
    head = head_module(x.shape[1], hidden)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.01 if p.dim() > 1 else 0.0))
    opt = torch.optim.Adam(head.parameters(), lr=0.05 if hidden == 0 else 0.01)
    for _ in range(epochs):
        opt.zero_grad()
        logit = head(z).squeeze(-1)  # (n,)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, y)
        loss = loss + l2 * sum((p**2).sum() for n_, p in head.named_parameters() if "weight" in n_)
        loss.backward()
        opt.step()
    return head.eval(), mean, std


def _calibration(psi: np.ndarray, y: np.ndarray, bins: int = 10) -> list[tuple[float, float, int]]:
    order = np.argsort(psi)
    out = []
    for part in np.array_split(order, min(bins, len(order))):
        if len(part):
            out.append((float(psi[part].mean()), float(y[part].mean()), int(len(part))))
    return out


def learn_twist(
    make_model: Callable[[Any, Any, Any], Model],
    lm: Any,
    prompts: Sequence[Any],
    features: TwistFeatures,
    *,
    n_particles: int = 5,
    ess_threshold: float = 0.5,
    runs_per_prompt: int = 1,
    rounds: int = 1,
    held_out: float = 0.25,
    hidden: int = 0,
    l2: float = 1e-3,
    epochs: int = 300,
    clip: float = 20.0,
    success: Callable[[Model], bool] | None = None,
    target: str = "success",
    seed: int = 0,
    max_cpu_seconds: float | None = None,
    progress: bool = True,
) -> LearnedTwist:
    """Fit a twist from the program's own SMC runs on ``prompts`` (module docstring).

    Parameters
    ----------
    make_model : Callable[[lm, prompt, twist], Model]
        Builds the program for a prompt with a given twist: an async callable of the particle
        that returns log ψ, which the program applies at every step (``HardConstraint`` takes
        it as ``twist=``; a program of one's own calls ``await twist.retwist(self)``).
    lm
        Passed to ``make_model``.
    prompts : Sequence
        Training prompts (what ``make_model`` takes). A ``held_out`` fraction of them (by
        prompt, at least one when there are two or more) is kept for the held-out loss.
    features : TwistFeatures
        What the twist reads.
    n_particles, ess_threshold
        The SMC runs (``smc_standard``); ``ess_threshold=0`` gives independent rollouts.
    runs_per_prompt, rounds : int
        Runs per prompt and round; rounds after the first run under the twist fitted so far.
    held_out : float
        Fraction of prompts held out, in [0, 1).
    hidden, l2, epochs, clip
        The head (0: linear; else tanh units), its L2 penalty, Adam epochs, the clip of log ψ.
    success : Callable[[Model], bool] | None
        A final particle's outcome φ (default: finished with positive weight).
    target : {"success", "weight"}
        The label of a prefix: φ (``"success"``), or φ times the untwisted weight the
        particle gained after it, clipped to 1 (``"weight"``; needs ``ess_threshold=0``).
    seed : int
        Seeds the runs (run k of the round r: ``seed + 1000 r + k``), the split and the fit.
    max_cpu_seconds : float | None
        Stop starting runs once this much process CPU time is spent (the fit comes after).
    progress : bool
        A tqdm bar over the runs and the held-out loss printed after each round.

    Warns (``UserWarning``, also listed on ``report.warnings``) when the training labels carry
    no signal, or when the head is no better than a constant on the held-out prefixes, saying
    what to change (module docstring, "When the fit cannot help").
    """
    if not callable(make_model):
        raise TypeError(f"make_model must be callable, got {type(make_model).__name__}")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts must name at least one training prompt, got none")
    if not isinstance(features, TwistFeatures):
        raise TypeError(f"features must be TwistFeatures, got {type(features).__name__}")
    for name, value in (("runs_per_prompt", runs_per_prompt), ("rounds", rounds)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not 0 <= held_out < 1:
        raise ValueError(f"held_out must be in [0, 1), got {held_out!r}")
    if not isinstance(hidden, int) or hidden < 0:
        raise ValueError(f"hidden must be a non-negative integer, got {hidden!r}")
    succeeded = success or _succeeded
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    if target == "weight" and ess_threshold != 0:
        raise ValueError(
            "target='weight' needs independent runs (ess_threshold=0): resampling resets the "
            f"weights it reads; got ess_threshold={ess_threshold!r}"
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(prompts))
    n_held = 0 if len(prompts) < 2 or held_out == 0 else max(1, round(held_out * len(prompts)))
    held = set(order[:n_held].tolist())
    data: list[tuple[torch.Tensor, float, bool]] = []  # (prefix features, outcome, held out)
    report = TrainingReport()
    cpu0 = time.process_time()
    current: LearnedTwist | None = None
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=rounds * runs_per_prompt * len(prompts), desc="learn_twist", unit="run")
    try:
        for r in range(rounds):
            recorder = _Recorder(features, current)
            for k, (i, prompt) in enumerate(
                (i, p) for _ in range(runs_per_prompt) for i, p in enumerate(prompts)
            ):
                if max_cpu_seconds is not None and time.process_time() - cpu0 > max_cpu_seconds:
                    break
                model = make_model(lm, prompt, recorder)
                result = run(
                    smc_standard(model, n_particles, ess_threshold, seed=seed + 1000 * r + k)
                )
                report.rollouts += 1
                for p in result.particles:
                    trace = getattr(p, _TRACE, None)
                    ok = succeeded(p)
                    report.trajectories += 1
                    report.successes += int(ok)
                    for x, log_w in [] if trace is None else trace.rows():
                        data.append((x, _label(target, ok, p.weight, log_w), i in held))
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(success=f"{report.success_rate:.2f}", prefixes=len(data))
            report.rollout_cpu_seconds = time.process_time() - cpu0 - report.fit_cpu_seconds
            current = _fit(data, features, hidden, l2, epochs, clip, seed, report)
            if progress:
                print(f"learn_twist round {r + 1}/{rounds}: {report.summary()}", flush=True)
    finally:
        if bar is not None:
            bar.close()
    for message in _diagnosis(current.report, target):
        current.report.warnings.append(message)
        warnings.warn(message, UserWarning, stacklevel=2)
    return current


def _diagnosis(report: TrainingReport, target: str) -> list[str]:
    """What the fit cannot do, and what to change (module docstring, "When the fit cannot help")."""
    out = []
    mean, var = report.label_mean, report.label_variance
    if var < FLAT_LABELS:
        if target == "success" and mean >= 0.5:
            cause = (
                "nearly every rollout succeeded, so every prefix looks alike to the head. Use "
                "target='weight' with ess_threshold=0 (labels then grade the weight each prefix "
                "goes on to gain), or training prompts and settings under which some runs fail "
                "(harder prompts, a tighter max_tokens, fewer particles); or run without a twist"
            )
        elif target == "success":
            cause = (
                "nearly no rollout succeeded. Use more runs (runs_per_prompt, n_particles), "
                "easier training prompts, or a success= that also counts partial successes"
            )
        else:
            cause = (
                "every prefix goes on to gain about the same weight. Use other training "
                "prompts, a success= that tells outcomes apart, or run without a twist"
            )
        out.append(
            f"learn_twist: the {report.examples} training labels carry no signal (mean "
            f"{mean:.4f}, variance {var:.2g} < {FLAT_LABELS}): {cause}."
        )
    if report.held_out_examples and not report.held_out_loss < report.base_loss:
        out.append(
            f"learn_twist: the head is no better than a constant on the "
            f"{report.held_out_examples} held-out prefixes (cross-entropy "
            f"{report.held_out_loss:.4f} against {report.base_loss:.4f} nats for the training "
            "success rate), so the twist is not expected to help. Train on more and more varied "
            "prompts (prompts=, runs_per_prompt=), give features that tell good prefixes from "
            "bad, try another target or head (hidden=, l2=), or run without the twist."
        )
    return out


def _fit(data, features, hidden, l2, epochs, clip, seed, report) -> LearnedTwist:
    """Fit the head on the training prefixes; fill the report's losses and calibration."""
    fit0 = time.process_time()
    train = [(x, y) for x, y, h in data if not h]
    test = [(x, y) for x, y, h in data if h]
    if not train:
        raise ValueError("no training prefixes were recorded: does the program call its twist?")
    x = torch.stack([x for x, _ in train])  # (n, D)
    y = torch.tensor([y for _, y in train])  # (n,)
    head, mean, std = fit_head(x, y, hidden, l2, epochs, seed)
    twist = LearnedTwist(features, head, mean, std, clip, hidden, report)
    report.label_mean, report.label_variance = float(y.mean()), float(y.var(unbiased=False))
    with torch.no_grad():
        report.train_loss = _bce(head((x - mean) / std).squeeze(-1), y)
        report.examples, report.held_out_examples = len(train), len(test)
        if test:
            xt = torch.stack([x for x, _ in test])
            yt = torch.tensor([y for _, y in test])
            logit = head((xt - mean) / std).squeeze(-1)
            report.held_out_loss = _bce(logit, yt)
            rate = float(y.mean().clamp(1e-6, 1 - 1e-6))
            report.base_loss = _bce(torch.full_like(yt, math.log(rate / (1 - rate))), yt)
            psi = torch.sigmoid(logit).numpy()
            report.calibration = _calibration(psi, yt.numpy())
    report.fit_cpu_seconds += time.process_time() - fit0
    return twist
