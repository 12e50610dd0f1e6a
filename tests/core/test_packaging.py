"""A wheel holds every package: pyproject.toml's ``packages`` lists each folder with an
``__init__.py`` under ``llamppl/`` (editable installs find them anyway; a wheel would not)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_in_pyproject():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")  # (tomllib needs Python 3.11)
    line = re.search(r"^packages = \[(.*)\]$", text, re.M).group(1)
    listed = set(re.findall(r'"([^"]+)"', line))
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "llamppl").rglob("__init__.py")
    }
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
