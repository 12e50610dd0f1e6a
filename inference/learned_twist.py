"""A learned twist ψ_θ(prefix) and what its training reported: the object
:func:`~llamppl.inference.twist_learning.learn_twist` returns, saved and loaded here.

log ψ_θ = min(0, max(-clip, f_θ(standardised features))) with f_θ linear or one tanh layer
(Twisted SMC, Zhao et al. 2024; ``papers.md`` §6): positive and finite, so any such ψ_θ is a
valid twist and cancels at the end (module docstring of :mod:`llamppl.inference.twist_learning`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch

from llamppl.modeling import Model

from .twist_features import TwistFeatures

__all__ = ["LearnedTwist", "TrainingReport", "head_module"]


def head_module(dim: int, hidden: int) -> torch.nn.Module:
    """f_θ: linear (``hidden=0``) or one tanh layer of ``hidden`` units."""
    if hidden == 0:
        return torch.nn.Linear(dim, 1)
    return torch.nn.Sequential(
        torch.nn.Linear(dim, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)
    )


@dataclass
class TrainingReport:
    """What :func:`learn_twist` did: data, fit and cost.

    Attributes
    ----------
    rollouts : int
        Program runs (one SMC run each).
    trajectories, successes : int
        Final particles recorded, and those that succeeded.
    examples, held_out_examples : int
        Prefixes in the training and held-out sets (held-out prompts are never trained on).
    train_loss, held_out_loss, base_loss : float
        Mean cross-entropy (nats) of the head on the training and held-out prefixes, and of
        the constant prediction (the training success rate) on the held-out prefixes.
    calibration : list[tuple[float, float, int]]
        Held-out ``(mean predicted ψ, observed success rate, prefixes)`` per decile of ψ.
    rollout_cpu_seconds, fit_cpu_seconds : float
        Process CPU time of the runs and of the fit.
    label_mean, label_variance : float
        Mean and variance of the training labels: a variance near 0 (every label the same)
        leaves the head nothing to learn.
    warnings : list[str]
        What :func:`~llamppl.inference.twist_learning.learn_twist` warned about (labels that
        carry no signal, a head no better than a constant on held-out prefixes), each with
        what to change; empty when the fit looks useful.
    """

    rollouts: int = 0
    trajectories: int = 0
    successes: int = 0
    examples: int = 0
    held_out_examples: int = 0
    train_loss: float = math.nan
    held_out_loss: float = math.nan
    base_loss: float = math.nan
    calibration: list[tuple[float, float, int]] = field(default_factory=list)
    rollout_cpu_seconds: float = 0.0
    fit_cpu_seconds: float = 0.0
    label_mean: float = math.nan
    label_variance: float = math.nan
    warnings: list[str] = field(default_factory=list)

    @property
    def success_rate(self) -> float:
        """Fraction of recorded final particles that succeeded."""
        return self.successes / self.trajectories if self.trajectories else math.nan

    def summary(self) -> str:
        """One line for logs."""
        return (
            f"{self.rollouts} runs, {self.trajectories} particles ({self.success_rate:.2f} "
            f"succeeded), {self.examples} prefixes (+{self.held_out_examples} held out); "
            f"loss train {self.train_loss:.4f} held-out {self.held_out_loss:.4f} "
            f"(constant {self.base_loss:.4f}); CPU {self.rollout_cpu_seconds:.0f} s runs + "
            f"{self.fit_cpu_seconds:.0f} s fit"
        )


class LearnedTwist:
    """A twist log ψ_θ(prefix) = clip(log σ(f_θ(x)), −clip, 0) over a particle's features.

    Calling it, ``await learned(model)``, gives log ψ of the particle's prefix;
    :meth:`retwist` applies it through ``Model.twist``.

    Parameters
    ----------
    features : TwistFeatures
        What the head reads (:mod:`~llamppl.inference.twist_features`).
    head : torch.nn.Module
        f_θ on standardised features ``(n, D) → (n, 1)``.
    mean, std : torch.Tensor
        ``(D,)`` standardisation of the features (training statistics).
    clip : float
        log ψ is kept in [−clip, 0] (ψ positive and finite).
    hidden : int
        Hidden units of the head (0: linear).
    report : TrainingReport | None
        How it was trained (None for a twist built by hand).
    """

    def __init__(
        self,
        features: TwistFeatures,
        head: torch.nn.Module,
        mean: torch.Tensor,
        std: torch.Tensor,
        clip: float = 20.0,
        hidden: int = 0,
        report: TrainingReport | None = None,
    ) -> None:
        if not isinstance(features, TwistFeatures):
            raise TypeError(f"features must be TwistFeatures, got {type(features).__name__}")
        if not (isinstance(clip, (int, float)) and 0 < clip < math.inf):
            raise ValueError(f"clip must be a positive finite number, got {clip!r}")
        self.features, self.head = features, head.eval()
        self.mean = torch.as_tensor(mean, dtype=torch.float32)
        self.std = torch.as_tensor(std, dtype=torch.float32)
        self.clip, self.hidden, self.report = float(clip), int(hidden), report
        self.sharpness = 1.0

    @property
    def dim(self) -> int:
        """Width D of the feature vector."""
        return int(self.mean.shape[0])

    def log_psi_of(self, x: torch.Tensor) -> torch.Tensor:
        """log ψ of feature rows ``(n, D) → (n,)`` (or ``(D,) → ()``)."""
        if x.shape[-1] != self.dim:
            raise ValueError(
                f"the twist reads {self.dim} features ({', '.join(self.features.names)}), "
                f"got {x.shape[-1]}"
            )
        with torch.no_grad():
            logit = self.head(((x - self.mean) / self.std).float()).squeeze(-1)
            log_psi = self.sharpness * torch.nn.functional.logsigmoid(logit)
            return log_psi.clamp(-self.clip, 0.0)

    async def __call__(self, model: Model) -> float:
        """log ψ_θ of the particle's prefix (a finite number in [−clip, 0])."""
        return float(self.log_psi_of(await self.features(model)))

    async def retwist(self, model: Model) -> float:
        """Set the particle's outstanding twist to log ψ_θ of its prefix (``model.twist`` of the
        difference); returns it. Undo it when the particle ends (``model.untwist()``)."""
        level = await self(model)
        if level != model.twist_amount:
            model.twist(level - model.twist_amount)
        return level

    def __deepcopy__(self, memo: dict) -> LearnedTwist:
        return self  # particles share it

    def sharpened(self, sharpness: float) -> LearnedTwist:
        """The twist ψ_θ^sharpness (same head): a positive power of a positive twist is one
        too, so exactness is kept; above 1 resampling favours likely successes more greedily
        (a setting to choose on training prompts, not on evaluated ones)."""
        if not (isinstance(sharpness, (int, float)) and 0 < sharpness < math.inf):
            raise ValueError(f"sharpness must be a positive finite number, got {sharpness!r}")
        out = LearnedTwist(
            self.features, self.head, self.mean, self.std, self.clip, self.hidden, self.report
        )
        out.sharpness = float(sharpness)
        return out

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike) -> None:
        """Write the head, the standardisation and the feature specs (tensors and plain data,
        read back with ``torch.load(weights_only=True)``)."""
        report = None if self.report is None else dict(vars(self.report))
        torch.save(
            {
                "format": "llamppl.learned_twist/1",
                "head": self.head.state_dict(),
                "mean": self.mean,
                "std": self.std,
                "clip": self.clip,
                "hidden": self.hidden,
                "sharpness": self.sharpness,
                "names": list(self.features.names),
                "specs": self.features.specs(),
                "report": report,
            },
            os.fspath(path),
        )

    @classmethod
    def load(cls, path: str | os.PathLike, features: TwistFeatures | None = None) -> LearnedTwist:
        """Read a twist :meth:`save` wrote. ``features`` rebuilds what a user's function
        provided (:func:`~llamppl.inference.twist_features.text_feature`); its names must match."""
        data = torch.load(os.fspath(path), weights_only=True)
        if not isinstance(data, dict) or data.get("format") != "llamppl.learned_twist/1":
            raise ValueError(f"{os.fspath(path)!r} is not a learned twist saved by LearnedTwist")
        if features is None:
            features = TwistFeatures.from_specs(data["specs"])
        if list(features.names) != list(data["names"]):
            raise ValueError(
                f"features {list(features.names)} do not match the saved twist's "
                f"{list(data['names'])}"
            )
        head = head_module(int(data["mean"].shape[0]), int(data["hidden"]))
        head.load_state_dict(data["head"])
        report = None if data["report"] is None else TrainingReport(**data["report"])
        twist = cls(features, head, data["mean"], data["std"], data["clip"], data["hidden"], report)
        return twist.sharpened(data.get("sharpness", 1.0))

    def __repr__(self) -> str:
        kind = "linear" if self.hidden == 0 else f"MLP({self.hidden})"
        power = "" if self.sharpness == 1.0 else f", sharpness={self.sharpness:g}"
        return f"LearnedTwist({kind} over {self.features!r}, clip={self.clip:g}{power})"
