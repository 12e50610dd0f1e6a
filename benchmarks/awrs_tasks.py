r"""The molecule and pattern tasks of the AWRS paper: instances, prompts, stop rule and checks.

Shared by our benchmarks (``bench_molecules.py``, ``bench_patterns.py``) and the
genlm-control peer (``peers/genlm_awrs.py``), so both sides build the same prompts and check
the same constraints. The checks are the library's constraints (this module holds none of
their logic), each call under the library's time bound:

- molecules: :func:`llamppl.constraints.smiles` with ``leading_space=True`` (the prompt
  ends ``"Molecule:"``): partialsmiles' partial parse of every character prefix, each with
  its last symbol finished (closed under prefixes), and the complete parse;
- patterns: :func:`llamppl.constraints.regex_prefix` of the pattern. It *is* the task's check
  with no option added: prefix = ``regex.fullmatch(pattern, s, partial=True)`` (a partial
  full match), complete = ``regex.fullmatch(pattern, s)``, both with the ``regex``
  package's own ``timeout=`` set to the current bound. Patterns have no leading-space rule
  (their prompt is a chat template: the answer starts the assistant turn).

What it defines, as the data READMEs (``shared/data/molecular_synthesis``,
``shared/data/pattern_matching``) and the peers (the AWRS paper's code, genlm-eval) do:

- **Instances** (:func:`instances`): ``MoleculeInstance`` (20 molecules drawn at random from
  ``GDB17_sample.txt`` per instance, with Python's ``random`` as genlm-eval draws them: the
  peers' 100 instances are ``instances("molecules", 100, seed=1234)``) and ``PatternInstance``
  (a pattern of ``patterns.csv``, drawn with the seed).
- **Prompts** (``instance.prompt(tokenizer)``): the few-shot ``Molecule:`` list (plain text,
  no chat template); the regex prompt of genlm-eval's pattern-matching domain through the
  LM's chat template.
- **Checks** (``instance.constraint``, ``instance.prefix_ok(text)``,
  ``instance.complete_ok(text)``): above; a check past ``timeout`` seconds raises
  :class:`llamppl.constraints.CheckTimeout` (a ``BaseException``).
- **Stopping** (:data:`STOP`): EOS or any token containing a newline ends the text; at most
  100 tokens.

The metric is in :mod:`awrs_metrics`, records and the table in :mod:`awrs_records`, the
command line in ``awrs_report.py``.

Example
-------
>>> import awrs_tasks as T                       # with benchmarks/ on sys.path
>>> inst = T.instances("patterns", 1, seed=1234)[0]
>>> inst.pattern, inst.prefix_ok("ab"), inst.complete_ok("ab!")
('\\w+(?!ing\\b)', True, False)
>>> mol = T.instances("molecules", 1)[0]        # needs partialsmiles
>>> mol.prefix_ok(" CC(=O"), mol.prefix_ok(" CC(=O)X"), mol.complete_ok(" CC(=O)O")
(True, False, True)
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from awrs_metrics import Score, molecule_score, pattern_score

from llamppl.constraints import Constraint, regex_prefix, time_bound
from llamppl.decoding.chemistry import smiles
from llamppl.decoding.constraints import bounded_call

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
    "Instance",
    "MoleculeInstance",
    "PatternInstance",
    "StopRule",
    "instances",
    "load_molecules",
    "load_patterns",
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
CHECK_TIMEOUT = 1.0  # seconds one constraint check may take (CheckTimeout past it)

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
    """One task instance: its prompt, its constraint and its metric.

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

    def make_constraint(self) -> Constraint:
        """The task's constraint, a library constraint (built once: :attr:`constraint`)."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_constraint")

    @cached_property
    def constraint(self) -> Constraint:
        """The task's constraint (its checks remember their verdicts, so it is built once)."""
        return self.make_constraint()

    def prefix_ok(self, text: str, timeout: float | None = CHECK_TIMEOUT) -> bool:
        """Whether the constraint still allows ``text`` as a prefix (``CheckTimeout`` past
        ``timeout`` seconds; None: no bound)."""
        with time_bound(timeout):
            return bool(bounded_call(self.constraint, text))

    def complete_ok(self, text: str, timeout: float | None = CHECK_TIMEOUT) -> bool:
        """Whether the constraint accepts ``text`` as a finished string (bounded likewise)."""
        with time_bound(timeout):
            return bool(bounded_call(self.constraint.accepts_end, text))

    def score(self, text: str) -> Score:
        """The task metric of a finished text (:mod:`awrs_metrics`)."""
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

    def make_constraint(self) -> Constraint:
        return smiles(leading_space=True)

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

    def make_constraint(self) -> Constraint:
        return regex_prefix(self.pattern)

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
