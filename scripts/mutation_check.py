"""Do the exactness tests have power? Break the library on purpose, one way at a time, and see.

Each mutation below is a small edit that changes what a proposal targets (a weight off by
10 %, a token left out of a listing, a newline that can no longer end a text, a time-out
taken as a rejection, ...). For each one this script copies the working tree into a scratch
directory, applies the edit there (the tree itself is never touched), runs the tests that
should notice, and reports ``caught`` (a test failed) or ``MISSED`` (all passed). A
mutation whose text no longer occurs in its file is reported as ``stale``: update the
list when the code moves. It first runs the same tests on the unmutated copy, which must
pass.

    python scripts/mutation_check.py              # every mutation, two at a time
    python scripts/mutation_check.py -k listing   # those whose name contains "listing"
    python scripts/mutation_check.py --list       # names only
    python scripts/mutation_check.py --every-test # which tests catch each mutation (slower)

Exit status 0 only when the baseline passes and every mutation is caught. Run it before
each change that touches a proposal (``models/hard_constraints.py``, ``models/
token_check.py``, ``llamppl/decoding/proposals/``, ``llamppl/decoding/constraints/``). About 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

EXACT = "tests/models/test_lazy_exactness.py"
TOKEN_CHECK = "tests/models/test_token_check.py"
TIMEOUTS = "tests/models/test_check_timeouts.py"
LAZY = "tests/models/test_lazy_constraints.py"
PROPOSAL = "tests/decoding/test_lazy_proposal.py"


@dataclass(frozen=True)
class Mutation:
    """Replace ``old`` (which must occur exactly once in ``path``) by ``new``."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = [
    Mutation(
        "lazy weight x1.1",
        "llamppl/decoding/proposals/lazy.py",
        "return LazyDraw(a, math.log(known), lp_a, calls)",
        "return LazyDraw(a, math.log(known * 1.1), lp_a, calls)",
        (EXACT, LAZY, PROPOSAL),
    ),
    Mutation(
        "listed draw weight x1.1",
        "llamppl/decoding/proposals/lazy.py",
        "return LazyDraw(w, log_z, lp, calls)",
        "return LazyDraw(w, log_z + math.log(1.1), lp, calls)",
        (EXACT, LAZY, PROPOSAL),
    ),
    Mutation(
        "last check adds p(b) instead of the unseen mass",
        "llamppl/decoding/proposals/lazy.py",
        "known += unseen if ok else 0.0",
        "known += math.exp(lp_b) if ok else 0.0",
        (EXACT, PROPOSAL, LAZY),
    ),
    Mutation(
        "hint weight without 1/beta",
        "llamppl/decoding/proposals/lazy.py",
        "return LazyDraw(h, log_mass - math.log(hint_prob), lp_h, 0)",
        "return LazyDraw(h, log_mass, lp_h, 0)",
        (EXACT, LAZY),
    ),
    Mutation(
        "rest branch weight without 1/(1-beta)",
        "llamppl/decoding/proposals/lazy.py",
        "draw.log_weight - math.log1p(-hint_prob)",
        "draw.log_weight",
        (EXACT, LAZY),
    ),
    Mutation(
        "listing drops the first allowed token",
        "llamppl/decoding/proposals/vocab_trie.py",
        "self.ids.extend(ids)",
        "self.ids.extend(ids if self.ids else ids[1:])",
        (TOKEN_CHECK, EXACT, PROPOSAL),
    ),
    Mutation(
        "listing drops end tokens",
        "llamppl/decoding/proposals/token_check.py",
        "found = self.kept + (list(self.end_ids) if self.end_ids and self(self.end_ids[0]) else [])",
        "found = self.kept",
        (TOKEN_CHECK, EXACT),
    ),
    Mutation(
        "listing skips the budget check",
        "llamppl/decoding/proposals/token_check.py",
        "if not budgeted or self._timed(self._check, w):",
        "if True:",
        (TOKEN_CHECK, LAZY),
    ),
    Mutation(
        "newline removed by the cheap mask",
        "models/constraint_formulations.py",
        "mask[torch.as_tensor(model.end_ids, dtype=torch.long, device=mask.device)] = True",
        "mask[list(lm.eos_token_ids)] = True",
        (EXACT,),
    ),
    Mutation(
        "a forced end token taken as text",
        "models/hard_constraints.py",
        "if token is None or token in self.end_ids:",
        "if token is None:",
        (EXACT,),
    ),
    Mutation(
        "plain callables closed under prefixes by default",
        "llamppl/decoding/constraints/protocol.py",
        "        prefix_closed: bool = False,\n        complete: Callable",
        "        prefix_closed: bool = True,\n        complete: Callable",
        (EXACT,),
    ),
    Mutation(
        "sound listings where cut texts are kept unchecked",
        "models/hard_constraints.py",
        'self.sound_listings = self.truncated != "keep"',
        "self.sound_listings = True",
        (EXACT,),
    ),
    Mutation(
        "the time-out is an Exception",
        "llamppl/decoding/constraints/time_bound.py",
        "class CheckTimeout(BaseException):",
        "class CheckTimeout(Exception):",
        (TIMEOUTS,),
    ),
    Mutation(
        "a swallowed time-out taken as the check's answer",
        "llamppl/decoding/constraints/time_bound.py",
        "    if fired:\n        raise CheckTimeout",
        "    if False:\n        raise CheckTimeout",
        (TIMEOUTS,),
    ),
    Mutation(
        "a draw's time-out kept for the text alone",
        "llamppl/decoding/proposals/token_check.py",
        "scan = (tuple(context), state, left, only_end, self.end_ids, self.bound)",
        "scan = (state, left, self.bound)",
        (TIMEOUTS,),
    ),
]


def scratch_copy(dest: Path) -> None:
    """The working tree's files (tracked and new, not ignored) under ``dest``, importable as
    ``llamppl`` from there (``models/`` and ``inference/`` linked in as the package-dir
    mapping of pyproject.toml makes them)."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / os.fsdecode(name)
        if src.is_file():
            target = dest / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    for sub in ("models", "inference"):
        (dest / "llamppl" / sub).symlink_to(Path("..") / sub)


def run_tests(
    copy: Path, tests: tuple[str, ...], timeout: float, stop: bool = True
) -> tuple[int, str]:
    """pytest on ``tests`` in ``copy`` (stopping at the first failure unless ``stop`` is
    false): (exit code, the first failure and its message, or the summary line)."""
    env = dict(os.environ, PYTHONPATH=str(copy), LLAMPPL_PROGRESS="0")
    first = ["-x"] if stop else ["-rf"]
    cmd = [sys.executable, "-m", "pytest", *first, "-q", "-p", "no:cacheprovider", *tests]
    try:
        out = subprocess.run(
            cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:g} s"
    lines = out.stdout.splitlines()
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    why = [line[1:].strip() for line in lines if line.startswith("E ")][:1]
    last = lines[-1:] if lines else [out.stderr[-300:]]
    if failed and not stop:  # every failing test, and the count
        return out.returncode, f"{last[0] if last else ''}: " + "; ".join(
            f.split("::")[-1].split(" - ")[0] for f in failed
        )
    return out.returncode, " ".join(failed[:1] + why) if failed else (last[0] if last else "")


def check(
    mutation: Mutation, copy: Path, timeout: float, stop: bool = True
) -> tuple[str, float, str]:
    """Apply ``mutation`` in ``copy``, run its tests, restore the file: (verdict, s, detail)."""
    path = copy / mutation.path
    original = path.read_text()
    if original.count(mutation.old) != 1:
        return "stale", 0.0, f"the text to mutate occurs {original.count(mutation.old)} times"
    start = time.monotonic()
    path.write_text(original.replace(mutation.old, mutation.new))
    try:
        code, detail = run_tests(copy, mutation.tests, timeout, stop)
    finally:
        path.write_text(original)
    seconds = time.monotonic() - start
    if code == 1:
        return "caught", seconds, detail
    if code == 0:
        return "MISSED", seconds, detail
    return "error", seconds, f"pytest exit code {code}: {detail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="only mutations whose name contains this")
    parser.add_argument("--list", action="store_true", help="print the mutations' names")
    parser.add_argument("--workers", type=int, default=2, help="mutations checked at once")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per test run")
    parser.add_argument(
        "--every-test",
        action="store_true",
        help="run every test of a mutation (not up to the first failure): which tests catch it",
    )
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if args.k in m.name]
    if args.list:
        print("\n".join(f"{m.name}  ({m.path})" for m in MUTATIONS))
        return 0
    if not chosen:
        print(f"no mutation's name contains {args.k!r}", file=sys.stderr)
        return 2
    workers = max(1, min(args.workers, len(chosen)))
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llamppl-mutation-") as tmp:
        copies = [Path(tmp) / f"copy{i}" for i in range(workers)]
        for copy in copies:
            scratch_copy(copy)
        tests = tuple(sorted({t for m in chosen for t in m.tests}))
        code, detail = run_tests(copies[0], tests, args.timeout * 2)
        print(f"baseline (no mutation) on {len(tests)} test files: exit {code} {detail}")
        if code != 0:
            print("the tests fail without any mutation: fix them first", file=sys.stderr)
            return 1
        free = list(copies)
        results: dict[str, tuple[str, float, str]] = {}

        def task(m: Mutation) -> None:
            copy = free.pop()
            try:
                results[m.name] = check(m, copy, args.timeout, not args.every_test)
                verdict, seconds, detail = results[m.name]
                print(f"{verdict:7s} {seconds:6.1f} s  {m.name}  [{detail}]", flush=True)
            finally:
                free.append(copy)

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(task, chosen))
    caught = sum(v == "caught" for v, _, _ in results.values())
    print(
        f"{caught} of {len(chosen)} mutations caught in {time.monotonic() - start:.0f} s "
        f"({workers} at a time)"
    )
    return 0 if caught == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
