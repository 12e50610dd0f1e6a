"""The learned twist of ``bench_collie.py --methods smc-learned``: trained on dev prompts the run
does not evaluate, cached, its use chosen on validation prompts.

``smc-learned`` runs the ``smc`` method's program (:func:`smc_program`: ``HardConstraint`` on
``collie_constraint(instance)``, lazy proposal, ``max_tokens`` from ``token_budget``) with
``twist=`` a twist fitted by :func:`llamppl.inference.twist_learning.learn_twist` on that same
program's own SMC runs (the pattern of ``awrs_twist.py`` for molecules and patterns):

- **Training prompts**: ``per_structure`` prompts of each structure of COLLIE's dev half,
  (``focus_per_structure`` of c05, c12, c14) drawn with :data:`TRAIN_SEED`
  (``collie_judge.choose_prompts``), minus every prompt the run evaluates and every prompt of
  the report's evaluations (:data:`REPORT_EVALUATIONS`, so one file serves them all); the
  dropped ones are part of the cache key, so a twist is never reused for a run
  that evaluates one of its training prompts (checked again on load). An evaluation seed
  equal to :data:`TRAIN_SEED` or a :data:`VALIDATION_SEEDS` one is refused.
- **Label**: a final particle succeeded when it ended by the program's own complete check
  (finished, no failure, positive weight: its constraint accepted the text). COLLIE's judge
  (``collie_judge.py``) never labels anything here; it only grades evaluated texts.
- **Features**: ``constraint_signals()`` (the complete check, ``need``, ``missing``),
  ``progress()`` (budget used and left) and ``repetition()`` (periods 1-3); the LM's hidden
  state only with ``hidden_state=True`` (off: not shown to help). Head: linear (an MLP of 8
  units fitted worse than a constant on held-out prompts; ``reports/learned_twists.md``).
- **Cache**: ``benchmarks/twists/collie-<key>.pt``, the key a hash of every setting
  (:class:`CollieTwistSettings`), with ``collie-<key>.json`` beside it naming the training
  prompts and the training report. ``python benchmarks/collie_twist.py`` (re)trains it and
  prints its held-out loss and calibration; training CPU is reported apart from the runs'.
- **Use**: the learned log ψ is added to ``HardConstraint``'s hand-weighted twists (``add``)
  or replaces them (``replace``: ``end_twist = need_twist = target_twist = 0``), raised to a
  power a (``LearnedTwist.sharpened``): :data:`MODE` and :data:`SHARPNESS`, chosen by
  ``python benchmarks/collie_twist.py --validate 314159`` on validation prompts (training
  side: drawn with a validation seed, disjoint from the training prompts and from the
  report's evaluated prompts).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import collie_judge as cj

from llamppl.inference.twist_features import (
    TwistFeatures,
    constraint_signals,
    hidden_state,
    progress,
    repetition,
)
from llamppl.inference.twist_learning import LearnedTwist, learn_twist

__all__ = [
    "MODE",
    "MODES",
    "SHARPNESS",
    "TRAIN_SEED",
    "VALIDATION_SEEDS",
    "CollieTwistSettings",
    "features_for",
    "learned_twist",
    "smc_program",
    "training_prompts",
    "validate",
]

TRAIN_SEED = 271828  # the training prompts' draw; no evaluation uses it
#: Seeds of the validation prompts that chose :data:`MODE` and :data:`SHARPNESS`.
VALIDATION_SEEDS = (314159, 161803)
MODES = ("add", "replace")
#: How the method uses the learned twist, chosen on validation prompts (module docstring):
#: ``--validate 314159 --variants hand add:1 add:3 replace:1`` gave 7/9, 7/9, 8/9, 2/9 and
#: ``--validate 161803 --variants hand add:3 add:5`` 7/9, 6/9, 7/9 (c05, c12, c14; the
#: program's own check): replacing the hand-weighted terms loses; added, ψ^3 ties with them.
MODE = "add"
SHARPNESS = 3.0
#: The report's evaluations ``(per_structure, seed, structures)``: training and validation
#: prompts avoid all of their prompts, so that one cached twist serves every one of them.
REPORT_EVALUATIONS = ((2, 0, cj.STRUCTURES), (10, 0, ("c05", "c12", "c14")))
CACHE = Path(__file__).resolve().parent / "twists"


@dataclass(frozen=True)
class CollieTwistSettings:
    """Every setting the learned twist depends on (the cache key hashes them all)."""

    train_seed: int = TRAIN_SEED
    per_structure: int = 2
    structures: tuple[str, ...] = cj.STRUCTURES
    #: structures drawn ``focus_per_structure`` times instead (the ones SMC still fails)
    focus: tuple[str, ...] = ("c05", "c12", "c14")
    focus_per_structure: int = 6
    n_particles: int = 8
    runs_per_prompt: int = 1
    plain: bool = True  # the library's plain characters, as the evaluated program
    hidden_state: bool = False
    hidden: int = 0  # linear: an MLP(8) fitted worse than a constant on held-out prompts
    l2: float = 1e-3
    epochs: int = 400
    rounds: int = 1
    max_cpu_seconds: float = 840.0  # no run starts after 14 CPU minutes
    #: training prompts dropped because the run evaluates them (``key#index``, sorted)
    dropped: tuple[str, ...] = ()
    version: int = 1  # bump when the program or the features change

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def path(self) -> Path:
        return CACHE / f"collie-{self.key()}.pt"


def features_for(settings: CollieTwistSettings) -> TwistFeatures:
    """The features the twist reads (module docstring)."""
    parts = [constraint_signals(), progress(), repetition()]
    if settings.hidden_state:
        parts.append(hidden_state())
    return TwistFeatures(*parts)


def smc_program(
    lm: Any,
    inst: Mapping[str, Any],
    twist: Any = None,
    *,
    plain: bool = True,
    mode: str = "add",
) -> Any:
    """The ``smc`` method's program on ``inst``, with ``twist`` added to the hand-weighted twists
    (``mode="add"``) or alone (``"replace"``)."""
    from llamppl.constraints import collie_constraint, token_budget
    from llamppl.models import HardConstraint

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    prompt = list(lm.apply_chat_template([{"role": "user", "content": inst["prompt"]}]))
    constraint = collie_constraint(inst, plain=plain)
    alone = {"end_twist": 0.0, "need_twist": 0.0, "target_twist": 0.0}
    return HardConstraint(
        lm,
        prompt,
        constraint,
        "lazy",
        token_budget(lm, constraint),
        twist=twist,
        **(alone if mode == "replace" and twist is not None else {}),
    )


def succeeded(model: Any) -> bool:
    """The label: ended by the program's own complete check (never COLLIE's judge)."""
    return bool(model.finished and model.failure is None and model.weight > float("-inf"))


def instance_id(inst: Mapping[str, Any]) -> str:
    return f"{inst['key']}#{inst['index']}"


def training_prompts(
    instances: Iterable[Mapping[str, Any]],
    settings: CollieTwistSettings,
    evaluated: Iterable[Mapping[str, Any]] = (),
) -> tuple[list[Mapping[str, Any]], tuple[str, ...]]:
    """``(training instances, ids of the dropped ones)``: ``per_structure`` prompts of each
    structure (``focus_per_structure`` of the focus ones) drawn with the training seed, in
    rounds over the structures (so a CPU bound cuts every structure alike), minus every prompt
    equal to an evaluated one."""
    k = max(settings.per_structure, settings.focus_per_structure)
    drawn = cj.choose_prompts(list(instances), k, settings.train_seed, list(settings.structures))
    drawn = {
        s: v[: settings.focus_per_structure if s in settings.focus else settings.per_structure]
        for s, v in drawn.items()
    }
    seen = {inst["prompt"] for inst in evaluated}
    rounds = max((len(v) for v in drawn.values()), default=0)
    ordered = [v[i] for i in range(rounds) for v in drawn.values() if i < len(v)]
    kept = [inst for inst in ordered if inst["prompt"] not in seen]
    dropped = tuple(sorted(instance_id(inst) for inst in ordered if inst["prompt"] in seen))
    return kept, dropped


def learned_twist(
    lm: Any,
    settings: CollieTwistSettings,
    instances: Sequence[Mapping[str, Any]],
    evaluated: Iterable[Mapping[str, Any]] = (),
    retrain: bool = False,
) -> tuple[LearnedTwist, float, Path]:
    """``(twist, training CPU seconds, file)``: loaded from the cache or trained (and saved)."""
    evaluated = list(evaluated)
    train, dropped = training_prompts(instances, settings, evaluated)
    if dropped:
        print(f"  [twist] {len(dropped)} training prompt(s) equal an evaluated one: dropped")
    settings = replace(settings, dropped=dropped)
    path = settings.path()
    meta_path = path.with_suffix(".json")
    features = features_for(settings)
    if path.is_file() and meta_path.is_file() and not retrain:
        meta = json.loads(meta_path.read_text())
        overlap = {i["prompt"] for i in evaluated} & set(meta["training_prompts"])
        if overlap:  # cannot happen with an honest key; checked anyway
            raise ValueError(f"the cached twist {path} was trained on an evaluated prompt")
        twist = LearnedTwist.load(path, features=features)
        print(f"  [twist] loaded {path.name}: {twist.report.summary()}", flush=True)
        return twist, meta["training_cpu_s"], path
    print(
        f"  [twist] training {path.name} on {len(train)} prompts (seed {settings.train_seed}, "
        f"N = {settings.n_particles}, at most {settings.max_cpu_seconds:.0f} CPU s of runs)",
        flush=True,
    )
    cpu0 = time.process_time()
    twist = learn_twist(
        lambda lm_, inst, tw: smc_program(lm_, inst, tw, plain=settings.plain),
        lm,
        train,
        features,
        n_particles=settings.n_particles,
        runs_per_prompt=settings.runs_per_prompt,
        rounds=settings.rounds,
        hidden=settings.hidden,
        l2=settings.l2,
        epochs=settings.epochs,
        success=succeeded,
        seed=settings.train_seed,
        max_cpu_seconds=settings.max_cpu_seconds,
    )
    cpu = time.process_time() - cpu0
    path.parent.mkdir(parents=True, exist_ok=True)
    twist.save(path)
    report = twist.report
    meta = {
        "settings": asdict(settings),
        "training_prompts": [i["prompt"] for i in train[: report.rollouts]],
        "training_ids": [instance_id(i) for i in train[: report.rollouts]],
        "prompts_not_run": [instance_id(i) for i in train[report.rollouts :]],
        "training_cpu_s": cpu,
        "report": {k: v for k, v in vars(report).items()},
    }
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    print(f"  [twist] saved {path} (training CPU {cpu:.0f} s)", flush=True)
    print(f"  [twist] {report.summary()}", flush=True)
    print(
        "  [twist] held-out calibration (mean ψ, success rate, prefixes): "
        f"{[(round(p, 3), round(r, 3), n) for p, r, n in report.calibration]}",
        flush=True,
    )
    return twist, cpu, path


def report_prompts(instances: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The prompts of the report's evaluations (:data:`REPORT_EVALUATIONS`)."""
    out: list[Mapping[str, Any]] = []
    for k, seed, structures in REPORT_EVALUATIONS:
        picked = cj.choose_prompts(instances, k, seed)  # as bench_collie draws, then keeps some
        out += [i for s in structures for i in picked.get(s, [])]
    return out


def validation_prompts(
    instances: Sequence[Mapping[str, Any]],
    seed: int,
    per_structure: int,
    structures: Sequence[str],
    settings: CollieTwistSettings,
) -> list[Mapping[str, Any]]:
    """Prompts drawn with a validation seed, none a training prompt or a report's evaluated one."""
    if seed not in VALIDATION_SEEDS:
        raise ValueError(f"validate on a training-side seed {VALIDATION_SEEDS}, got {seed}")
    avoid = {i["prompt"] for i in report_prompts(instances)}
    train, _ = training_prompts(instances, settings, report_prompts(instances))
    avoid |= {i["prompt"] for i in train}
    grouped = cj.distinct_prompts(instances)
    import random

    rng = random.Random(seed)
    out = []
    for s in structures:
        pool = [p for p in grouped[s] if p not in avoid]
        out += [grouped[s][p][0] for p in rng.sample(pool, min(per_structure, len(pool)))]
    return out


def validate(
    lm: Any,
    instances: Sequence[Mapping[str, Any]],
    settings: CollieTwistSettings,
    seed: int,
    variants: Sequence[str],
    per_structure: int = 3,
    structures: Sequence[str] = ("c05", "c12", "c14"),
    n: int = 8,
) -> list[dict]:
    """Each variant (``hand``: the ``smc`` method; ``add:A``/``replace:A``: the learned twist
    at sharpness A added to or replacing the hand-weighted terms) on the validation prompts,
    all runs at once. Scored by the program's own check on the drawn text (COLLIE's judge is
    printed beside it, not used to choose)."""
    import bench_collie as B
    from _concurrency import solve_all

    prompts = validation_prompts(instances, seed, per_structure, structures, settings)
    # the twist the evaluations of the report use (it avoids their prompts, so also these)
    twist, _, path = learned_twist(lm, settings, instances, report_prompts(instances))
    problems, labels = [], []
    for v in variants:
        learned = None
        if v != "hand":
            mode, a = v.split(":")
            learned = {"twist": twist.sharpened(float(a)), "mode": mode, "sharpness": float(a)}
        for j, inst in enumerate(prompts):
            method = "smc" if learned is None else "smc-learned"
            problems.append((B.solve, (method, inst, n, True, 0, learned), seed + j))
            labels.append(v)
    records: list[dict] = []

    def write(i: int, rec: dict) -> None:
        if "error" in rec:
            print(f"problem {i} failed:\n{rec['error']}", flush=True)
            return
        rec["variant"] = labels[i]
        records.append(rec)
        print(
            f"  [validate {seed}] {labels[i]:12s} {rec['structure']} {rec['key']}#{rec['index']} "
            f"own={rec['own_check']!s:5} judge={rec['satisfied']!s:5} "
            f"cpu={rec['cpu_seconds']:.1f}s {rec['text'][:50]!r}",
            flush=True,
        )

    cpu0 = time.process_time()
    solve_all(lm, problems, len(problems), write)
    print(f"  [validate {seed}] CPU {time.process_time() - cpu0:.0f} s, {len(problems)} runs")
    print("| variant | own check | judge | median CPU s | mean CPU s |")
    print("|---|---|---|---|---|")
    import statistics

    for v in variants:
        rs = [r for r in records if r["variant"] == v]
        own = sum(r["own_check"] for r in rs)
        ok = sum(r["satisfied"] for r in rs)
        cpus = [r["cpu_seconds"] for r in rs]
        print(
            f"| {v} | {own}/{len(rs)} | {ok}/{len(rs)} | {statistics.median(cpus):.1f} | "
            f"{statistics.mean(cpus):.1f} |"
        )
    return records


def main(argv: list[str] | None = None) -> None:
    """``python benchmarks/collie_twist.py [--retrain]``: train (or load) the twist the
    report's evaluations use and print its report; ``--validate SEED --variants hand add:1
    replace:1 ...``: the variants on validation prompts."""
    import torch

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--retrain", action="store_true")
    parser.add_argument("--validate", type=int, default=None, help="a validation seed")
    parser.add_argument("--variants", nargs="+", default=["hand", "add:1", "replace:1"])
    parser.add_argument("--per-structure", type=int, default=3, help="validation prompts")
    parser.add_argument("--structures", default="c05,c12,c14", help="validation structures")
    args = parser.parse_args(argv)
    os.environ.setdefault("NLTK_DATA", str(cj.NLTK_DATA))
    torch.set_num_threads(1)
    print(f"[twist] torch threads {torch.get_num_threads()}")
    from llamppl import CachedCausalLM

    instances = cj.load()
    lm = CachedCausalLM.default()
    settings = CollieTwistSettings()
    if args.validate is not None:
        validate(
            lm,
            instances,
            settings,
            args.validate,
            args.variants,
            args.per_structure,
            args.structures.split(","),
        )
        return
    twist, cpu, path = learned_twist(
        lm, settings, instances, report_prompts(instances), args.retrain
    )
    print(json.dumps({"twist": str(path), "cpu_s": cpu, **vars(twist.report)}))


if __name__ == "__main__":
    main(sys.argv[1:])
