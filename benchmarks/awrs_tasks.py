r"""The molecule and pattern tasks of issue #30, shared by our benchmarks and the genlm-control peer.

Plain Python (numpy, plus ``regex``, ``partialsmiles`` and ``rdkit`` imported where used): it
imports neither llamppl nor genlm, so ``benchmarks/bench_molecules.py``,
``benchmarks/bench_patterns.py`` (our venv) and ``benchmarks/peers/genlm_awrs.py`` (the
``.venv-genlm`` venv of ``scripts/setup-genlm.sh``) build the same prompts, check the same
constraints, score with the same metric and write the same records.

What it defines, as the data READMEs (``shared/data/molecular_synthesis``,
``shared/data/pattern_matching``) and the peers (the AWRS paper's code, genlm-eval) do:

- **Instances** (:func:`instances`): ``MoleculeInstance`` (20 molecules drawn at random from
  ``GDB17_sample.txt`` per instance, with Python's ``random`` as genlm-eval draws them: the
  peers' 100 instances are ``instances("molecules", 100, seed=1234)``) and ``PatternInstance``
  (a pattern of ``patterns.csv``, drawn with the seed).
- **Prompts** (``instance.prompt(tokenizer)``): the few-shot ``Molecule:`` list (plain text,
  no chat template); the regex prompt of genlm-eval's pattern-matching domain through the
  LM's chat template.
- **Constraints** (``instance.prefix_ok(text)``, ``instance.complete_ok(text)``): partial
  SMILES (``partialsmiles``) and a partial regex full match (``regex``), each with a time bound
  per call (:class:`CheckTimeout`).
- **Stopping** (:data:`STOP`): EOS or any token containing a newline ends the text; at most
  100 tokens.
- **Metrics** (``instance.score(text)``, :func:`posterior_score`, :func:`bootstrap_ci`): RDKit
  validity and QED; ``regex.fullmatch``; the posterior-weighted score of a particle set.
- **Records** (:class:`RunRecord`, :func:`append_record`, :func:`read_records`) and the table
  (:func:`report`; ``python benchmarks/awrs_tasks.py report A.jsonl B.jsonl``).

Example
-------
>>> import awrs_tasks as T                       # with benchmarks/ on sys.path
>>> inst = T.instances("patterns", 1, seed=1234)[0]
>>> inst.pattern, inst.prefix_ok("ab"), inst.complete_ok("ab!")
('\\w+(?!ing\\b)', True, False)
>>> particles = [T.Particle(" CCO", 0.75, True), T.Particle(" C1C", 0.25, True)]
>>> T.posterior_score(particles, T.instances("molecules", 1)[0].score)  # needs rdkit
(0.305..., 0.75)
"""

from __future__ import annotations

import csv
import json
import math
import random
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "CHECK_TIMEOUT",
    "DATA",
    "MOLECULES_FILE",
    "MOLECULE_SYSTEM_PROMPT",
    "N_MOLECULES",
    "PATTERNS_FILE",
    "PATTERN_FEW_SHOT",
    "PATTERN_SYSTEM_PROMPT",
    "PEER_INSTANCES",
    "PEER_SEED",
    "STOP",
    "TASKS",
    "CheckTimeout",
    "Instance",
    "MoleculeInstance",
    "Particle",
    "PatternInstance",
    "RunRecord",
    "Score",
    "StopRule",
    "append_record",
    "bootstrap_ci",
    "instances",
    "load_molecules",
    "load_patterns",
    "molecule_score",
    "pattern_complete_ok",
    "pattern_prefix_ok",
    "pattern_score",
    "posterior_score",
    "read_records",
    "report",
    "smiles_complete_ok",
    "smiles_open_count",
    "smiles_prefix_ok",
    "summarize",
]

DATA = next(
    (
        up / "shared" / "data"
        for up in Path(__file__).resolve().parents[1:]
        if (up / "shared" / "data" / "molecular_synthesis").is_dir()
    ),
    Path("../shared/data"),
)
MOLECULES_FILE = DATA / "molecular_synthesis" / "GDB17_sample.txt"
PATTERNS_FILE = DATA / "pattern_matching" / "patterns.csv"

TASKS = ("molecules", "patterns")
N_MOLECULES = 20  # molecules in one few-shot prompt
PEER_INSTANCES = 100  # the peers' molecule instances ...
PEER_SEED = 1234  # ... drawn with this seed
CHECK_TIMEOUT = 1.0  # CPU seconds one constraint check may take (CheckTimeout past it)

MOLECULE_SYSTEM_PROMPT = (
    "You are an expert in chemistry. "
    "You are given a list of molecules in SMILES format. "
    "You are asked to write another molecule in SMILES format with similar chemical properties."
)
PATTERN_SYSTEM_PROMPT = (
    "You are a helpful assistant that generates strings matching regular expressions. "
    "Only output the exact string that matches the regex pattern, nothing more."
)
PATTERN_FEW_SHOT = (("(ab)+", "ab"), ("(ab|cd)+", "cd"), ("[a-z]+", "hello"))


# --------------------------------------------------------------------------- stopping rule


@dataclass(frozen=True)
class StopRule:
    """When generation ends: the peers' rule, as data both sides read.

    Parameters
    ----------
    eos : bool
        The LM's end-of-sequence token ends the text.
    newline : bool
        Any token whose text contains ``"\\n"`` ends the text (the token is not part of it).
    max_tokens : int
        At most this many tokens are generated; a text still open then is *cut* (not finished).
    """

    eos: bool = True
    newline: bool = True
    max_tokens: int = 100

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")

    def ends(self, token_text: str | bytes, is_eos: bool = False) -> bool:
        """Whether a token with this text (``is_eos``: the LM's EOS) ends the text."""
        newline = b"\n" if isinstance(token_text, bytes) else "\n"
        return (self.eos and is_eos) or (self.newline and newline in token_text)

    def stop_token_ids(
        self, vocab: Sequence[str | bytes], eos_token_ids: Iterable[int]
    ) -> list[int]:
        """Ids of every token that ends the text, for a vocabulary (text or bytes per id)."""
        eos = set(eos_token_ids)
        return [i for i, text in enumerate(vocab) if self.ends(text, i in eos)]


STOP = StopRule()


# --------------------------------------------------------------------------- time bound


class CheckTimeout(Exception):
    """A constraint check ran past its time bound (cause ``"check timeout"``)."""

    cause = "check timeout"


def _raise_timeout(signum, frame):  # noqa: ARG001 - signal handler signature
    raise CheckTimeout("constraint check exceeded its time bound")


@contextmanager
def time_bound(seconds: float | None) -> Iterator[None]:
    """Raise :class:`CheckTimeout` in the block once it has used ``seconds`` of CPU (None: no bound).

    CPU time, as the ``regex`` package's ``timeout=`` counts it, so that a check is not cut short
    because other processes share the cores. On the main thread of a Unix process the block is
    interrupted by ``SIGPROF`` (pure Python code such as ``partialsmiles`` stops within one
    bytecode step). Elsewhere it cannot be interrupted, and the bound is checked when the
    block returns.
    """
    if seconds is None:
        yield
        return
    if not seconds > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {seconds!r}")
    if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGPROF, _raise_timeout)
        signal.setitimer(signal.ITIMER_PROF, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGPROF, previous)
        return
    start = time.process_time()
    yield
    if time.process_time() - start > seconds:
        raise CheckTimeout("constraint check exceeded its time bound")


# --------------------------------------------------------------------------- predicates


def _smiles(text: str) -> str:
    """The SMILES in a generated text: one leading space dropped (the prompt ends ``Molecule:``)."""
    return text[1:] if text.startswith(" ") else text


def _parse_smiles(text: str, partial: bool, timeout: float | None) -> bool:
    import partialsmiles

    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    with time_bound(timeout):
        try:
            partialsmiles.ParseSmiles(_smiles(text), partial=partial)
        except CheckTimeout:
            raise
        except Exception:  # noqa: BLE001 - partialsmiles raises several error types
            return False
    return True


def smiles_prefix_ok(text: str, timeout: float | None = CHECK_TIMEOUT) -> bool:
    """Whether ``text`` is a valid partial SMILES (``ParseSmiles(s, partial=True)`` does not raise).

    One leading space is dropped first. Raises :class:`CheckTimeout` past ``timeout`` seconds.
    """
    return _parse_smiles(text, True, timeout)


def smiles_open_count(text: str) -> int:
    """Ring bonds and branches a SMILES prefix leaves open (bracket atoms skipped).

    Each needs a later ring digit or ``)`` before the molecule can end, so the count says
    how far the text is from an ending. It is a guide, not a strict bound on tokens (one
    token such as ``12`` or ``)1`` can close two at once).

    >>> smiles_open_count(" BrC1=C2C3CC(C"), smiles_open_count("C1CC1C(=O)O")
    (4, 0)
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    rings: set[str] = set()
    depth, i, t = 0, 0, text.strip()
    while i < len(t):
        ch = t[i]
        if ch == "[":  # a bracket atom: its digits are charges or counts, not ring bonds
            end = t.find("]", i)
            i = len(t) if end < 0 else end + 1
            continue
        if ch == "%" and t[i + 1 : i + 3].isdigit():  # a two-digit ring bond
            rings ^= {t[i + 1 : i + 3]}
            i += 3
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch.isdigit():
            rings ^= {ch}
        i += 1
    return len(rings) + depth


def smiles_complete_ok(text: str, timeout: float | None = CHECK_TIMEOUT) -> bool:
    """Whether ``text`` is a complete valid SMILES (``ParseSmiles(s, partial=False)``)."""
    return _parse_smiles(text, False, timeout)


@lru_cache(maxsize=512)
def _compiled(pattern: str):
    import regex

    return regex.compile(pattern)


def _fullmatch(pattern: str, text: str, partial: bool, timeout: float | None) -> bool:
    if not isinstance(pattern, str) or not isinstance(text, str):
        raise TypeError("pattern and text must be str")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    try:
        return _compiled(pattern).fullmatch(text, partial=partial, timeout=timeout) is not None
    except TimeoutError as exc:
        raise CheckTimeout(f"regex check exceeded {timeout} s") from exc


def pattern_prefix_ok(pattern: str, text: str, timeout: float | None = CHECK_TIMEOUT) -> bool:
    """Whether ``text`` can still be extended to a full match (``fullmatch(..., partial=True)``).

    Raises :class:`CheckTimeout` past ``timeout`` seconds (the ``regex`` package's own bound).
    """
    return _fullmatch(pattern, text, True, timeout)


def pattern_complete_ok(pattern: str, text: str, timeout: float | None = CHECK_TIMEOUT) -> bool:
    """Whether ``pattern`` matches all of ``text`` (``regex.fullmatch``)."""
    return _fullmatch(pattern, text, False, timeout)


# --------------------------------------------------------------------------- metrics


class Score(NamedTuple):
    """The metric of one finished text: validity and score (0 when invalid)."""

    valid: bool
    value: float


@lru_cache(maxsize=4096)
def molecule_score(text: str) -> Score:
    """RDKit validity and QED of a generated molecule (surrounding whitespace stripped).

    Valid when ``Chem.MolFromSmiles`` parses it to at least one atom and ``Chem.Kekulize``
    succeeds; the score is ``QED.qed`` then, else 0.
    """
    from rdkit import Chem, RDLogger
    from rdkit.Chem import QED

    RDLogger.DisableLog("rdApp.*")
    mol = Chem.MolFromSmiles(text.strip())
    if mol is None or mol.GetNumAtoms() == 0:
        return Score(False, 0.0)
    try:
        Chem.Kekulize(mol)
        return Score(True, float(QED.qed(mol)))
    except Exception:  # noqa: BLE001 - RDKit raises its own error types
        return Score(False, 0.0)


def pattern_score(pattern: str, text: str, timeout: float | None = 10.0) -> Score:
    """1 when ``regex.fullmatch(pattern, text)``, else 0 (a match that times out counts as 0)."""
    try:
        ok = pattern_complete_ok(pattern, text, timeout)
    except CheckTimeout:
        ok = False
    return Score(ok, float(ok))


@dataclass(frozen=True)
class Particle:
    """One particle of a run's final set.

    Attributes
    ----------
    text : str
        The generated text (the stop token excluded).
    weight : float
        Its normalised posterior weight (weights of a set sum to 1, or all are 0).
    finished : bool
        True when a stop token ended it; False when it was cut at the token limit.
    """

    text: str
    weight: float
    finished: bool


def posterior_score(
    particles: Sequence[Particle], score: Callable[[str], Score], finished_only: bool = True
) -> tuple[float, float]:
    """Posterior-weighted score and validity of a particle set: ``(sum w s, sum w valid)``.

    As genlm-eval does, only finished particles with positive weight count (``finished_only``),
    renormalised among themselves; a set without one scores ``(0.0, 0.0)``.
    """
    kept = [p for p in particles if p.weight > 0 and (p.finished or not finished_only)]
    total = sum(p.weight for p in kept)
    if total <= 0:
        return 0.0, 0.0
    s = v = 0.0
    for p in kept:
        result = score(p.text)
        s += p.weight / total * result.value
        v += p.weight / total * float(result.valid)
    return s, v


def bootstrap_ci(
    values: Sequence[float], level: float = 0.95, n_resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """Mean and percentile-bootstrap interval of the mean: ``(mean, low, high)``.

    Parameters
    ----------
    values : sequence of float
        One value per (instance, replicate).
    level : float
        Coverage of the interval, in (0, 1).
    n_resamples : int
        Bootstrap resamples (with replacement, of ``len(values)`` each).
    seed : int
        Seed of the ``numpy.random.Generator`` that draws them.
    """
    x = np.asarray(list(values), dtype=float)
    if x.ndim != 1 or x.size == 0:
        raise ValueError("values must be a non-empty sequence of numbers")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_resamples, x.size))].mean(axis=1)  # (n_resamples,)
    low, high = np.percentile(means, [50 * (1 - level), 50 * (1 + level)])
    return float(x.mean()), float(low), float(high)


# --------------------------------------------------------------------------- instances


def load_molecules(path: Path = MOLECULES_FILE) -> list[str]:
    """The SMILES strings of ``GDB17_sample.txt``, one a line, in file order."""
    return [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]


def load_patterns(path: Path = PATTERNS_FILE) -> list[str]:
    """The ``regex`` column of ``patterns.csv``, in file order (row i is pattern id i)."""
    with Path(path).open(newline="") as fh:
        return [row["regex"] for row in csv.DictReader(fh)]


@dataclass(frozen=True)
class Instance:
    """One task instance: its prompt, its constraint checks and its metric.

    Attributes
    ----------
    task : str
        ``"molecules"`` or ``"patterns"``.
    id : int
        Instance id (the draw's index for molecules, the ``patterns.csv`` row for patterns).
    """

    task: str
    id: int

    def prompt(self, tokenizer: Any = None) -> str:
        """The prompt text (a ``transformers`` tokenizer where the chat template is needed)."""
        raise NotImplementedError(f"{type(self).__name__} must implement prompt")

    def prefix_ok(self, text: str, timeout: float | None = CHECK_TIMEOUT) -> bool:
        """Whether the constraint still allows ``text`` as a prefix."""
        raise NotImplementedError(f"{type(self).__name__} must implement prefix_ok")

    def complete_ok(self, text: str, timeout: float | None = CHECK_TIMEOUT) -> bool:
        """Whether the constraint accepts ``text`` as a finished string."""
        raise NotImplementedError(f"{type(self).__name__} must implement complete_ok")

    def score(self, text: str) -> Score:
        """The task metric of a finished text."""
        raise NotImplementedError(f"{type(self).__name__} must implement score")


@dataclass(frozen=True)
class MoleculeInstance(Instance):
    """A few-shot list of molecules; the model writes one more SMILES string.

    Prompt (no chat template; the text the peers encode)::

        You are an expert in chemistry. You are given ... similar chemical properties.
        Molecule: BrC1=C2C3C4C3N(CC4C#C)C2=NC(=O)S1
        ... (20 lines in all)
        Molecule:
    """

    molecules: tuple[str, ...] = ()

    def prompt(self, tokenizer: Any = None) -> str:  # noqa: ARG002 - no chat template
        lines = [MOLECULE_SYSTEM_PROMPT, *(f"Molecule: {m}" for m in self.molecules), "Molecule:"]
        return "\n".join(lines)

    def prefix_ok(self, text: str, timeout: float | None = CHECK_TIMEOUT) -> bool:
        return smiles_prefix_ok(text, timeout)

    def complete_ok(self, text: str, timeout: float | None = CHECK_TIMEOUT) -> bool:
        return smiles_complete_ok(text, timeout)

    def score(self, text: str) -> Score:
        return molecule_score(text)


@dataclass(frozen=True)
class PatternInstance(Instance):
    """A regular expression; the model writes a string it matches in full.

    Prompt: genlm-eval's chat messages (system line, three few-shot user/assistant pairs, the
    pattern as the last user message) through the tokenizer's chat template with the
    generation prompt, e.g. for SmolLM2::

        <|im_start|>system
        You are a helpful assistant that generates strings matching regular expressions. ...<|im_end|>
        <|im_start|>user
        (ab)+<|im_end|>
        <|im_start|>assistant
        ab<|im_end|>
        ... (two more pairs)
        <|im_start|>user
        ^(\\w)(\\w)(?:\\2\\1)+$<|im_end|>
        <|im_start|>assistant
    """

    pattern: str = ""

    def messages(self) -> list[dict[str, str]]:
        """The chat messages of the prompt (genlm-eval's ``chat_template_messages``)."""
        messages = [{"role": "system", "content": PATTERN_SYSTEM_PROMPT}]
        for example, response in PATTERN_FEW_SHOT:
            messages.append({"role": "user", "content": example})
            messages.append({"role": "assistant", "content": response})
        messages.append({"role": "user", "content": self.pattern})
        return messages

    def prompt(self, tokenizer: Any = None) -> str:
        if tokenizer is None or not hasattr(tokenizer, "apply_chat_template"):
            raise TypeError("the pattern prompt needs a tokenizer with apply_chat_template")
        return tokenizer.apply_chat_template(
            self.messages(), add_generation_prompt=True, tokenize=False
        )

    def prefix_ok(self, text: str, timeout: float | None = CHECK_TIMEOUT) -> bool:
        return pattern_prefix_ok(self.pattern, text, timeout)

    def complete_ok(self, text: str, timeout: float | None = CHECK_TIMEOUT) -> bool:
        return pattern_complete_ok(self.pattern, text, timeout)

    def score(self, text: str) -> Score:
        return pattern_score(self.pattern, text)


def instances(
    task: str,
    n: int,
    seed: int = PEER_SEED,
    n_molecules: int = N_MOLECULES,
    data: Path = DATA,
) -> list[Instance]:
    """The first ``n`` instances of a task drawn with ``seed`` (the same on both sides).

    Molecules: instance i holds ``n_molecules`` molecules drawn without replacement from
    ``GDB17_sample.txt`` by ``random.Random(seed)``, one ``sample`` call per instance in turn,
    as genlm-eval's ``MolecularSynthesisDataset.from_smiles`` draws them (the peers' 100
    instances are ``instances("molecules", 100, 1234)``; their first ``n`` are these).
    Patterns: ``n`` distinct rows of ``patterns.csv`` drawn by ``random.Random(seed).sample``.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    rng = random.Random(seed)
    if task == "molecules":
        molecules = load_molecules(Path(data) / "molecular_synthesis" / "GDB17_sample.txt")
        if not 1 <= n_molecules <= len(molecules):
            raise ValueError(f"n_molecules must be in [1, {len(molecules)}], got {n_molecules!r}")
        draws = [rng.sample(range(len(molecules)), n_molecules) for _ in range(n)]
        return [
            MoleculeInstance("molecules", i, tuple(molecules[j] for j in ids))
            for i, ids in enumerate(draws)
        ]
    patterns = load_patterns(Path(data) / "pattern_matching" / "patterns.csv")
    if n > len(patterns):
        raise ValueError(f"n must be at most {len(patterns)} for patterns, got {n}")
    return [
        PatternInstance("patterns", i, patterns[i]) for i in rng.sample(range(len(patterns)), n)
    ]


# --------------------------------------------------------------------------- records


@dataclass
class RunRecord:
    """One (method, instance, replicate) result: one JSON line, written by both sides.

    Attributes
    ----------
    method, task : str
        Method name (a table row) and ``"molecules"`` / ``"patterns"``.
    instance, replicate, n_particles : int
        Instance id, replicate index, number of particles.
    particles : list of Particle
        The final weighted particle set (empty after an error or timeout).
    score, valid : float
        Posterior-weighted score and validity (:func:`posterior_score`).
    predicate_calls : int
        Constraint checks made (prefix and complete).
    generated_tokens : int
        Tokens generated over all particles (one per particle extension, stop tokens included).
    cpu_seconds, wall_seconds : float
        Process CPU time and wall time of the timed part (model load and warm-up excluded).
    error : str or None
        Why the run gave no result (``"timeout: ..."``, an exception), else None.
    extra : dict
        Anything else a side records (seed, log_ml, ...).
    """

    method: str
    task: str
    instance: int
    replicate: int
    n_particles: int
    particles: list[Particle] = field(default_factory=list)
    score: float = 0.0
    valid: float = 0.0
    predicate_calls: int = 0
    generated_tokens: int = 0
    cpu_seconds: float | None = None
    wall_seconds: float | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if not isinstance(self.method, str) or not self.method:
            raise ValueError("method must be a non-empty string")
        for name in ("instance", "replicate", "n_particles", "predicate_calls", "generated_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        self.particles = [p if isinstance(p, Particle) else Particle(**p) for p in self.particles]

    def to_json(self) -> str:
        """One JSON line (no trailing newline)."""
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> RunRecord:
        """The record of one JSON line written by :meth:`to_json`."""
        return cls(**json.loads(line))


def append_record(path: Path | str, record: RunRecord) -> None:
    """Append one record to a JSON-lines file (created if missing)."""
    with Path(path).open("a", encoding="utf-8") as fh:
        fh.write(record.to_json() + "\n")


def read_records(*paths: Path | str) -> list[RunRecord]:
    """Every record of the given JSON-lines files, in order (blank lines skipped)."""
    records = []
    for path in paths:
        with Path(path).open(encoding="utf-8") as fh:
            records.extend(RunRecord.from_json(line) for line in fh if line.strip())
    return records


# --------------------------------------------------------------------------- report


def summarize(records: Sequence[RunRecord], seed: int = 0) -> list[dict[str, Any]]:
    """One row per (task, method, n_particles): the figures :func:`report` prints.

    ``score`` is the mean posterior-weighted score with its bootstrap 95 % interval over the
    records (instances x replicates; errors and timeouts count as 0); ``valid`` the mean
    posterior-weighted validity; ``cpu_s`` the median CPU seconds per record (a timeout counts
    with the CPU it used until it was stopped); ``calls_per_token`` the median over records with
    generated tokens of predicate calls / generated tokens; ``errors`` counts the records without
    a result, ``timeouts`` those of them stopped by a time bound.
    """
    groups: dict[tuple[str, str, int], list[RunRecord]] = {}
    for r in records:
        groups.setdefault((r.task, r.method, r.n_particles), []).append(r)
    rows = []
    for (task, method, n), rs in groups.items():
        mean, low, high = bootstrap_ci([r.score for r in rs], seed=seed)
        cpu = [r.cpu_seconds for r in rs if r.cpu_seconds is not None]
        per_token = [r.predicate_calls / r.generated_tokens for r in rs if r.generated_tokens]
        rows.append(
            {
                "task": task,
                "method": method,
                "n_particles": n,
                "records": len(rs),
                "instances": len({r.instance for r in rs}),
                "score": mean,
                "score_low": low,
                "score_high": high,
                "valid": statistics.fmean(r.valid for r in rs),
                "cpu_s": statistics.median(cpu) if cpu else math.nan,
                "calls_per_token": statistics.median(per_token) if per_token else math.nan,
                "errors": sum(r.error is not None for r in rs),
                "timeouts": sum((r.error or "").startswith("timeout") for r in rs),
            }
        )
    return rows


def report(records: Sequence[RunRecord], seed: int = 0) -> str:
    """A plain-text table of :func:`summarize`, then its rows as one JSON line."""
    rows = summarize(records, seed=seed)
    head = (
        f"{'task':<10} {'method':<38} {'N':>3} {'runs':>4}  {'score [95% CI]':<22} "
        f"{'valid':>5} {'CPU s':>8} {'calls/tok':>9} {'errors':>6} {'timeouts':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        ci = f"{r['score']:.3f} [{r['score_low']:.3f}, {r['score_high']:.3f}]"
        lines.append(
            f"{r['task']:<10} {r['method']:<38} {r['n_particles']:>3} {r['records']:>4}  "
            f"{ci:<22} {r['valid']:>5.2f} {r['cpu_s']:>8.1f} {r['calls_per_token']:>9.2f} "
            f"{r['errors']:>6} {r['timeouts']:>8}"
        )
    lines.append(json.dumps({"awrs_report": rows}))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """``python benchmarks/awrs_tasks.py report FILE.jsonl ...``: print the table."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="table of one or more JSON-lines record files")
    rep.add_argument("files", nargs="+", type=Path)
    rep.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = parser.parse_args(argv)
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    print(report(read_records(*args.files), seed=args.seed))


if __name__ == "__main__":
    main(sys.argv[1:])
