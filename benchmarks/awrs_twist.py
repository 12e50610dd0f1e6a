"""The learned twist of the ``smc-learned`` method: trained on prompts no evaluation uses, cached.

``awrs_runs.py --methods smc-learned`` runs :class:`~llamppl.models.HardConstraint` with the
task's constraint alone (the partial-SMILES checks, or the pattern's regex) and a twist
fitted by :func:`llamppl.inference.twist_learning.learn_twist` on the program's own SMC runs:

- **Training prompts**: the task's instances drawn with :data:`TRAIN_SEED` (never an
  evaluation seed: ``--seed`` equal to it is refused), minus any instance equal to an
  evaluated one; a twist trained without some prompts is cached under its own key (the
  dropped prompts are hashed with the settings), so an evaluation never loads a twist that
  saw one of its prompts.
- **Cache**: ``benchmarks/twists/<task>-<key>.pt``, the key a hash of every training setting
  (:class:`TwistSettings`), so a repeated run loads it instead of training; the file holds
  the head (a few KB) and its training report. ``python benchmarks/awrs_twist.py molecules``
  (re)trains it; its CPU seconds are printed and stored in each record's ``extra``, apart
  from the run's own CPU.
- **Sharpness**: the method runs with ψ_θ^a (:meth:`~llamppl.inference.twist_learning.
  LearnedTwist.sharpened`, exact for any a > 0), a = :data:`SHARPNESS` chosen by the valid
  rate on validation prompts drawn with :data:`VALIDATION_SEEDS` (training side, never an
  evaluation seed): ``python benchmarks/awrs_twist.py molecules --validate 314159
  --sharpness 1 2 3``.
- **Features**: the particle's complete check, the budget used and left, looping (periods 1-3)
  and the LM's hidden state, plus, for molecules, the count of open ring bonds and branches
  of the text (:func:`llamppl.decoding.chemistry.open_closures`) whose weight the fit learns.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import awrs_tasks as T

from llamppl.decoding.chemistry import Smiles, open_closures
from llamppl.inference.twist_features import (
    TwistFeatures,
    constraint_signals,
    hidden_state,
    progress,
    repetition,
    text_feature,
)
from llamppl.inference.twist_learning import LearnedTwist, learn_twist
from llamppl.models import HardConstraint

__all__ = [
    "SHARPNESS",
    "TRAIN_SEED",
    "VALIDATION_SEEDS",
    "TwistSettings",
    "dropped_prompts",
    "features_for",
    "learned_twist",
    "make_program",
    "validate",
]

TRAIN_SEED = 271828  # the training prompts' draw; no evaluation uses it
#: Seeds of the validation prompts that chose :data:`SHARPNESS` (training side: never evaluated).
VALIDATION_SEEDS = (314159, 161803, 141421, 173205)
#: The power of ψ_θ the method runs with (``LearnedTwist.sharpened``), chosen by
#: ``python benchmarks/awrs_twist.py molecules --validate 314159 --sharpness 1 2 3`` (and 161803).
SHARPNESS = 3.0
CACHE = Path(__file__).resolve().parent / "twists"


@dataclass(frozen=True)
class TwistSettings:
    """Every setting the learned twist depends on (the cache key hashes them all)."""

    task: str
    train_seed: int = TRAIN_SEED
    prompts: int = 40
    runs_per_prompt: int = 1
    n_particles: int = 10
    hidden_state: bool = False
    hidden: int = 8
    l2: float = 1e-3
    epochs: int = 400
    rounds: int = 1
    version: int = 1  # bump when the program or the features change

    def key(self, dropped: Sequence[str] = ()) -> str:
        """Hash of every setting and of the training prompts dropped (equal to an evaluated one)."""
        blob = asdict(self) | ({"dropped": sorted(dropped)} if dropped else {})
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:12]

    def path(self, dropped: Sequence[str] = ()) -> Path:
        """The cache file of the twist trained without the ``dropped`` prompts."""
        return CACHE / f"{self.task}-{self.key(dropped)}.pt"


def features_for(settings: TwistSettings) -> TwistFeatures:
    """The features the task's twist reads (module docstring)."""
    parts = [constraint_signals(), progress(), repetition()]
    if settings.task == "molecules":
        parts.append(text_feature(open_closures, "open_closures"))
    if settings.hidden_state:
        parts.append(hidden_state())
    return TwistFeatures(*parts)


def make_program(lm, instance: T.Instance, twist, constraint=None) -> HardConstraint:
    """The evaluated program: the task's checks alone, its stop rule, and ``twist``."""
    if constraint is None:
        constraint = (
            Smiles(instance.constraint.leading_space)
            if isinstance(instance, T.MoleculeInstance)
            else instance.make_constraint()
        )
    return HardConstraint(
        lm,
        instance.prompt(lm.tokenizer),
        constraint,
        "lazy",
        max_tokens=T.STOP.max_tokens,
        stop="newline",
        check_timeout=T.CHECK_TIMEOUT,
        twist=twist,
    )


def _ended(model) -> bool:
    """Success: ended by a stop token with the complete check passed (the metric's finished)."""
    return bool(model.finished and model.failure is None and model.ending == "end token")


def _training_instances(settings: TwistSettings, evaluated) -> list[T.Instance]:
    drawn = T.instances(settings.task, settings.prompts, seed=settings.train_seed)
    seen = {_identity(i) for i in evaluated}
    return [i for i in drawn if _identity(i) not in seen]


def _identity(instance: T.Instance) -> str:
    return repr(getattr(instance, "molecules", None) or getattr(instance, "pattern", None))


def dropped_prompts(settings: TwistSettings, evaluated) -> list[str]:
    """The training prompts equal to an evaluated one (left out of training; part of the key)."""
    seen = {_identity(i) for i in evaluated}
    drawn = T.instances(settings.task, settings.prompts, seed=settings.train_seed)
    return [_identity(i) for i in drawn if _identity(i) in seen]


def learned_twist(
    lm, settings: TwistSettings, evaluated=(), retrain: bool = False
) -> tuple[LearnedTwist, float, bool]:
    """``(twist, training CPU seconds, trained now)``: loaded from the cache or trained."""
    train = _training_instances(settings, evaluated)
    dropped = dropped_prompts(settings, evaluated)
    if dropped:
        print(
            f"  [twist] {len(dropped)} training prompt(s) equal an evaluated one: dropped "
            "(a twist of its own, cached apart)"
        )
    path = settings.path(dropped)
    features = features_for(settings)
    if path.is_file() and not retrain:
        twist = LearnedTwist.load(path, features=features)
        cpu = twist.report.rollout_cpu_seconds + twist.report.fit_cpu_seconds
        print(f"  [twist] loaded {path.name}: {twist.report.summary()}", flush=True)
        return twist, cpu, False
    print(f"  [twist] training {path.name} on {len(train)} prompts (seed {settings.train_seed})")
    cpu0 = time.process_time()
    twist = learn_twist(
        lambda lm_, inst, tw: make_program(lm_, inst, tw),
        lm,
        train,
        features,
        n_particles=settings.n_particles,
        runs_per_prompt=settings.runs_per_prompt,
        rounds=settings.rounds,
        hidden=settings.hidden,
        l2=settings.l2,
        epochs=settings.epochs,
        success=_ended,
        seed=settings.train_seed,
    )
    cpu = time.process_time() - cpu0
    path.parent.mkdir(parents=True, exist_ok=True)
    twist.save(path)
    print(f"  [twist] saved {path} (training CPU {cpu:.0f} s)", flush=True)
    print(
        f"  [twist] held-out calibration (mean ψ, success rate, prefixes): "
        f"{[(round(p, 3), round(r, 3), n) for p, r, n in twist.report.calibration]}",
        flush=True,
    )
    return twist, cpu, True


def validate(
    lm, settings: TwistSettings, seed: int, sharpness: list[float], n: int = 8, move: int = 0
) -> None:
    """Valid rate of ``smc-learned`` (N = 5) at each sharpness on ``n`` validation prompts drawn
    with ``seed`` (a training-side seed: :data:`VALIDATION_SEEDS`), the ``n`` runs at once;
    ``move`` > 0 adds ``ResampleMove(k=move)``."""
    import asyncio

    import awrs_metrics as M
    import awrs_runs as A

    from llamppl import run

    if seed not in VALIDATION_SEEDS:
        raise ValueError(f"validate on a training-side seed {VALIDATION_SEEDS}, got {seed}")
    prompts = T.instances(settings.task, n, seed=seed)
    twist, _, _ = learned_twist(lm, settings, prompts)

    async def at(a: float) -> list[float]:
        A.LEARNED[settings.task] = {"twist": twist.sharpened(a)}
        outs = await asyncio.gather(
            *(A.solve_method("smc-learned", lm, inst, 5, k, move) for k, inst in enumerate(prompts))
        )
        return [M.posterior_score(o.particles, i.score)[1] for o, i in zip(outs, prompts)]

    for a in sharpness:
        cpu0 = time.process_time()
        valid = run(at(a))
        print(
            f"  [validate seed {seed}] sharpness {a:g} move {move}: valid {sum(valid) / len(valid):.3f} "
            f"{[round(v, 2) for v in valid]} CPU {time.process_time() - cpu0:.0f} s "
            f"({n} runs at once)",
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    """``python benchmarks/awrs_twist.py molecules [--retrain] [--validate SEED --sharpness A
    ...]``: train (or load) and report; with ``--validate``, the valid rate per sharpness on
    validation prompts."""
    import torch

    from llamppl import CachedCausalLM

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("task", choices=T.TASKS)
    parser.add_argument("--retrain", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--validate", type=int, default=None, help="a validation seed")
    parser.add_argument("--sharpness", type=float, nargs="+", default=[1.0, SHARPNESS])
    parser.add_argument("--move", type=int, default=0, help="validate with ResampleMove(k=MOVE)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"[twist] torch threads {torch.get_num_threads()}")
    if args.validate is not None:
        lm = CachedCausalLM.default()
        validate(lm, TwistSettings(args.task), args.validate, args.sharpness, move=args.move)
        return
    twist, cpu, _ = learned_twist(
        CachedCausalLM.default(), TwistSettings(args.task), (), args.retrain
    )
    print(
        json.dumps(
            {
                "twist": str(TwistSettings(args.task).path()),
                "cpu_s": cpu,
                **{k: v for k, v in vars(twist.report).items() if k != "calibration"},
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
