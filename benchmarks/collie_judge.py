"""COLLIE-v1's own checker, rebuilt from the shared JSON trees: the judge of the COLLIE benchmark.

The instances live in ``../shared/data/collie/collie_v1.json`` (see that folder's README):
each has a ``prompt``, the ``targets`` of its constraint, a human ``example`` and the
``constraint`` itself as a JSON tree naming classes of ``collie.constraints`` (PyPI
``collie-bench`` 0.1.0). This module turns a tree back into COLLIE's object and grades a
text with ``constraint.check(text, targets)``, exactly as the paper's evaluation does.

It only *grades*. Generation must never call it (that would be grading ourselves): the
library's own text constraints split text with :mod:`llamppl.decoding.text.units` and are
tested against this judge, not built from it.

NLTK data. COLLIE splits words and sentences with NLTK's Punkt model (``punkt_tab``). Unless
``NLTK_DATA`` is already set, importing this module points it at the copy shared beside
the repository (``../shared/data/collie/nltk_data``); :func:`use_nltk_data` picks another
folder. Nothing is downloaded.

Install: ``pip install -e ".[collie]"`` then ``pip install --no-deps collie-bench==0.1.0``
(its declared dependencies, openai and fschat among ~60 packages, are not needed to check
text: ``collie.constraints`` imports only ``nltk`` and ``rich``).

Example::

    from collie_judge import load, judge, choose_prompts
    instances = load()                       # the shared development half
    first = instances[0]
    judge(first, first["example"])           # True: the reference text passes
    picked = choose_prompts(instances, k=2, seed=0)   # {"c01": [inst, inst], ...}

Run it to check the rebuilt judge on every reference text::

    python benchmarks/collie_judge.py            # "collie_judge: 1048/1048 ... agree"
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "DATA",
    "NLTK_DATA",
    "STRUCTURES",
    "use_nltk_data",
    "rebuild",
    "constraint_of",
    "judge",
    "load",
    "distinct_prompts",
    "choose_prompts",
    "check_references",
]


def _shared(*parts: str) -> Path:
    """``shared/<parts>`` in the nearest parent folder of this file that has it, else ``../shared``."""
    for up in Path(__file__).resolve().parents[1:]:
        if (up / "shared" / Path(*parts)).exists():
            return up / "shared" / Path(*parts)
    return Path("..", "shared", *parts)


DATA = _shared("data", "collie", "collie_v1.json")
"""The shared development half of COLLIE-v1 (1,048 instances, 721 distinct prompts)."""
NLTK_DATA = _shared("data", "collie", "nltk_data")
"""The shared NLTK data folder holding ``tokenizers/punkt_tab/english``."""
STRUCTURES = (
    "c01",
    "c02",
    "c03",
    "c04",
    "c05",
    "c06a",
    "c07",
    "c08",
    "c09",
    "c10",
    "c11",
    "c12",
    "c14",
)
"""COLLIE-v1's 13 constraint structures, in the paper's order."""


def use_nltk_data(path: str | os.PathLike[str] | None = None, *, override: bool = False) -> str:
    """Point NLTK at a folder holding ``tokenizers/punkt_tab`` and return the folder used.

    Parameters
    ----------
    path
        The folder; default :data:`NLTK_DATA` (the shared copy).
    override
        When False (the default) an ``NLTK_DATA`` the user already set wins and ``path`` is
        ignored. When True, ``path`` is used whatever the environment says.

    Notes
    -----
    NLTK reads ``NLTK_DATA`` once, when it is imported; if it is already imported the folder
    is also put first on ``nltk.data.path``.
    """
    if "NLTK_DATA" in os.environ and not override:
        folder = os.environ["NLTK_DATA"].split(os.pathsep)[0]
    else:
        folder = str(Path(path if path is not None else NLTK_DATA).resolve())
        os.environ["NLTK_DATA"] = folder
    nltk = sys.modules.get("nltk")
    if nltk is not None and folder not in nltk.data.path:
        nltk.data.path.insert(0, folder)
    return folder


use_nltk_data()  # before collie imports nltk, so that nltk.data.path sees it


def _collie_classes() -> Any:
    try:
        import collie.constraints as classes
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the COLLIE judge needs PyPI collie-bench 0.1.0 and nltk: "
            'pip install -e ".[collie]" && pip install --no-deps collie-bench==0.1.0'
        ) from err
    return classes


def rebuild(tree: Any) -> Any:
    """The ``collie.constraints`` object (or plain value) described by a JSON tree.

    Parameters
    ----------
    tree
        A node ``{"class": NAME, **attributes}`` as stored in ``collie_v1.json``, or a plain
        JSON value (number, string, ``None``, list), returned with its lists rebuilt.

    Returns
    -------
    Any
        ``All(*callables)``, ``Relation(operand)``, ``Reduction(reduction, value)``,
        ``InputLevel(level)`` / ``TargetLevel(level)``, ``...`` for ``{"class": "Ellipsis"}``,
        and ``cls(**attributes)`` for every other class, children rebuilt first.

    Raises
    ------
    ValueError
        If a node names a class that ``collie.constraints`` does not define.
    """
    if isinstance(tree, list):
        return [rebuild(node) for node in tree]
    if not isinstance(tree, dict):
        return tree
    if "class" not in tree:
        raise ValueError(f"constraint node without a 'class' key: {sorted(tree)}")
    name = tree["class"]
    if name == "Ellipsis":
        return ...
    classes = _collie_classes()
    cls = getattr(classes, name, None)
    if not isinstance(cls, type):
        raise ValueError(f"constraint node names {name!r}, which collie.constraints lacks")
    attrs = {key: rebuild(value) for key, value in tree.items() if key != "class"}
    if name == "All":
        return cls(*attrs["callables"])
    if name == "Relation":
        return cls(attrs["operand"])
    if name == "Reduction":
        return cls(attrs["reduction"], attrs["value"])
    if name in ("InputLevel", "TargetLevel"):
        return cls(attrs["level"])
    return cls(**attrs)


_BUILT: dict[str, Any] = {}


def constraint_of(instance: Mapping[str, Any]) -> Any:
    """The rebuilt constraint object of an instance (memoised by its JSON tree)."""
    if not isinstance(instance, Mapping) or "constraint" not in instance:
        raise TypeError("instance must be a mapping with a 'constraint' tree (one COLLIE instance)")
    key = json.dumps(instance["constraint"], sort_keys=True)
    if key not in _BUILT:
        _BUILT[key] = rebuild(instance["constraint"])
    return _BUILT[key]


def judge(instance: Mapping[str, Any], text: str) -> bool:
    """COLLIE's verdict on ``text`` for ``instance``: ``constraint.check(text, targets)``.

    Parameters
    ----------
    instance
        One element of :func:`load`'s list (needs ``constraint`` and ``targets``).
    text
        The generated text, graded as given (strip a chat reply's framing before, if any).

    Raises
    ------
    TypeError
        If ``text`` is not a string or ``instance`` is not a COLLIE instance.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if "targets" not in instance:
        raise TypeError("instance must have 'targets' (one COLLIE instance)")
    return bool(constraint_of(instance).check(text, instance["targets"]))


def load(path: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """The instances of a COLLIE JSON file (default :data:`DATA`), in file order.

    Raises
    ------
    FileNotFoundError
        If the file does not exist (the message names it).
    ValueError
        If it is not a COLLIE file (no ``instances`` list).
    """
    file = Path(path if path is not None else DATA)
    if not file.is_file():
        raise FileNotFoundError(f"no COLLIE data at {file} (pass --data PATH)")
    data = json.loads(file.read_text(encoding="utf-8"))
    instances = data.get("instances") if isinstance(data, dict) else None
    if not isinstance(instances, list):
        raise ValueError(f"{file} is not a COLLIE file: expected an object with 'instances'")
    return instances


def distinct_prompts(
    instances: Iterable[Mapping[str, Any]],
) -> dict[str, dict[str, list[Mapping[str, Any]]]]:
    """Instances grouped by structure, then by prompt: ``{structure: {prompt: [instances]}}``.

    Instances that share a prompt share its constraint and targets (checked in the tests),
    so one prompt is one task; counts over prompts are the ones to report. Both levels keep
    first-seen order.
    """
    grouped: dict[str, dict[str, list[Mapping[str, Any]]]] = defaultdict(dict)
    for inst in instances:
        grouped[inst["structure"]].setdefault(inst["prompt"], []).append(inst)
    return dict(grouped)


def choose_prompts(
    instances: Iterable[Mapping[str, Any]],
    k: int,
    seed: int = 0,
    structures: Sequence[str] | None = None,
) -> dict[str, list[Mapping[str, Any]]]:
    """A seeded choice of ``k`` distinct prompts per structure, one instance for each.

    Parameters
    ----------
    instances
        COLLIE instances (:func:`load`).
    k
        Prompts per structure (all of them when a structure has fewer).
    seed
        Seeds the choice; the same seed and data give the same prompts.
    structures
        Which structures, in this order (default: every structure present, in
        :data:`STRUCTURES` order).

    Returns
    -------
    dict
        ``{structure: [instance, ...]}``: for each chosen prompt its first instance (they
        all share the prompt's constraint and targets).

    Raises
    ------
    ValueError
        If ``k`` is not a positive integer or a structure is not in the data.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    grouped = distinct_prompts(instances)
    if structures is None:
        structures = [s for s in STRUCTURES if s in grouped] + sorted(
            s for s in grouped if s not in STRUCTURES
        )
    rng = random.Random(seed)
    chosen: dict[str, list[Mapping[str, Any]]] = {}
    for structure in structures:
        if structure not in grouped:
            raise ValueError(
                f"structure {structure!r} is not in the data; present: {sorted(grouped)}"
            )
        prompts = list(grouped[structure])
        picked = rng.sample(prompts, min(k, len(prompts)))
        chosen[structure] = [grouped[structure][p][0] for p in picked]
    return chosen


def check_references(instances: Iterable[Mapping[str, Any]]) -> tuple[int, list[Mapping[str, Any]]]:
    """Grade every instance's ``example`` and compare with its ``reference_passes``.

    Returns
    -------
    tuple
        ``(agreeing, disagreeing)``: how many verdicts equal ``reference_passes`` and the
        instances whose verdict differs (empty when the rebuilt judge is the original one).
    """
    agree, differ = 0, []
    for inst in instances:
        if judge(inst, inst["example"]) == bool(inst["reference_passes"]):
            agree += 1
        else:
            differ.append(inst)
    return agree, differ


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="a COLLIE JSON file")
    parser.add_argument(
        "--nltk-data",
        type=Path,
        default=None,
        help="folder with tokenizers/punkt_tab (default: $NLTK_DATA, else the shared copy)",
    )
    args = parser.parse_args(argv)
    if args.nltk_data is not None:
        use_nltk_data(args.nltk_data, override=True)
    instances = load(args.data)
    agree, differ = check_references(instances)
    passes = sum(bool(inst["reference_passes"]) for inst in instances)
    for inst in differ:
        print(
            f"differs: {inst['key']}[{inst['index']}] reference_passes={inst['reference_passes']}"
        )
    print(
        f"collie_judge: {agree}/{len(instances)} reference verdicts agree "
        f"({passes} references pass, {len(instances) - passes} fail)"
    )
    return 0 if not differ else 1


if __name__ == "__main__":
    raise SystemExit(main())
