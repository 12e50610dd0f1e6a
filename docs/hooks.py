"""MkDocs hook: let mkdocstrings (griffe) find ``llamppl.inference`` and ``llamppl.models``.

The package maps two top-level folders into itself (``inference/`` →
``llamppl.inference``, ``models/`` → ``llamppl.models``, see ``pyproject.toml``).
Griffe's static analysis only follows real directories (it resolves symlinks),
so before each build this hook copies the sources into the installed layout
in a temporary directory and points the Python handler at it. Griffe's
warnings are rewritten to name the files in the repository (``models/x.py``,
not ``<tmp>/llamppl/models/x.py``).
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
from pathlib import Path

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = {
    "llamppl": ROOT / "llamppl",
    "llamppl/inference": ROOT / "inference",
    "llamppl/models": ROOT / "models",
}

_tmp: Path | None = None


class _RepoPaths(logging.Filter):
    """Rewrite paths inside the temporary tree to the source paths in the repository."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _tmp is not None and isinstance(record.msg, str):
            for rel, src in sorted(LAYOUT.items(), key=lambda kv: -len(kv[0])):
                record.msg = record.msg.replace(str(_tmp / rel), str(src.relative_to(ROOT)))
        return True


_griffe_logger = logging.getLogger("mkdocs.plugins.griffe")
for _old in [f for f in _griffe_logger.filters if type(f).__name__ == "_RepoPaths"]:
    _griffe_logger.removeFilter(_old)  # `mkdocs serve` reloads this hook on every build
_griffe_logger.addFilter(_RepoPaths())


def build_tree() -> Path:
    """(Re)create the installed package layout under a temporary directory; return that directory."""
    global _tmp
    if _tmp is None:
        _tmp = Path(tempfile.mkdtemp(prefix="llamppl-docs-src-"))
        atexit.register(shutil.rmtree, _tmp, True)
    shutil.rmtree(_tmp / "llamppl", ignore_errors=True)
    for rel, src in LAYOUT.items():
        shutil.copytree(src, _tmp / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return _tmp


@event_priority(100)  # before mkdocstrings creates its handlers in its own on_config
def on_config(config):
    handlers = config.plugins["mkdocstrings"].config.handlers
    handlers.setdefault("python", {})["paths"] = [str(build_tree())]
    return config
