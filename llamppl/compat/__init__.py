"""LLaMPPL compatibility in one place: one table of old spellings, one import hook that serves it.

Programs written for LLaMPPL (``genlm/llamppl``) or hfppl (its earlier name) use module paths,
names and signatures that differ from ours. Each such spelling is one row of
:data:`llamppl.compat.table.ALIASES` (``old -> ours``; the row kinds are described there), and
one finder on ``sys.meta_path``, installed by :func:`install` when ``llamppl`` is imported,
serves them all:

- an old module path imports as our module itself (``import hfppl.llms`` gives ``llamppl.llms``);
- an old module we have no counterpart for (``llamppl.llms``) is made from its rows;
- a module of ours that has rows gets them as it is imported: names are looked up on first
  use, class attributes are set on the class.

The core classes name none of this: their bodies are our API, and LLaMPPL's spellings are rows
(``docs/compat.md`` lists every row; a test checks it)::

    import llamppl
    from llamppl.compat import resolve
    assert resolve("llamppl.llms:CachedTransformer") is llamppl.CachedCausalLM
    assert resolve("hfppl:Model") is llamppl.Model

``hfppl/__init__.py`` is the one file outside this package: a fresh interpreter must find the
top-level name ``hfppl`` on disk before any hook runs, and that file hands it to the table.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .table import ALIASES

__all__ = ["ALIASES", "Rows", "SecondForm", "TableFinder", "install", "resolve", "second_form"]


@dataclass(frozen=True)
class SecondForm:
    """A table value that gives one of our names its LLaMPPL form as well: ``make(ours)`` takes the name."""

    make: Callable[[Any], Any]


def second_form(make: Callable[[Any], Any]) -> SecondForm:
    """Decorator for an adapter that receives our object and returns the one to install under its name."""
    return SecondForm(make)


class Rows:
    """The table sorted by what each row does (see :mod:`llamppl.compat.table`).

    Attributes
    ----------
    modules : dict[str, str]
        Old module path -> our module path.
    names : dict[str, dict[str, str]]
        Module -> {name: value path}: names added to our module, or making an old one.
    attributes : dict[str, dict[str, dict[str, str]]]
        Module -> class name -> {attribute: value path}.
    """

    def __init__(self, aliases: dict[str, str]) -> None:
        self.modules: dict[str, str] = {}
        self.names: dict[str, dict[str, str]] = {}
        self.attributes: dict[str, dict[str, dict[str, str]]] = {}
        for old, ours in aliases.items():
            module, _, qualname = old.partition(":")
            if not qualname:
                self.modules[module] = ours
            elif "." not in qualname:
                self.names.setdefault(module, {})[qualname] = ours
            else:
                cls, attribute = qualname.split(".")
                self.attributes.setdefault(module, {}).setdefault(cls, {})[attribute] = ours
        self.roots = {path.partition(".")[0] for path in (*self.modules, *self.owners())}

    def owners(self) -> set[str]:
        """Modules that get rows when they are imported."""
        return set(self.names) | set(self.attributes)

    def our_module(self, path: str) -> str:
        """``path`` with an old module prefix replaced by ours (``hfppl.llms`` -> ``llamppl.llms``)."""
        for _ in range(len(self.modules) + 1):  # a value may itself be an old path
            head = next((m for m in self.modules if path == m or path.startswith(m + ".")), None)
            if head is None:
                return path
            path = self.modules[head] + path[len(head) :]
        raise ValueError(f"the module rows of the compatibility table loop at {path!r}")


ROWS = Rows(ALIASES)


def resolve(path: str) -> Any:
    """The object a table path names: ``"module"`` or ``"module:name.attribute"`` (old or ours)."""
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(ROWS.our_module(module))
    for part in qualname.split(".") if qualname else ():
        obj = getattr(obj, part)
    return obj


# ---------------------------------------------------------------------- installing rows
def _install_module_rows(module: ModuleType, name: str) -> None:
    """Give module ``name`` its rows: class attributes, then names (looked up on first use)."""
    for cls_name, attributes in ROWS.attributes.get(name, {}).items():
        cls = getattr(module, cls_name)
        for attribute, value in attributes.items():
            prefix = f"{name}:{cls_name}."
            if value.startswith(prefix):  # a rename on the same class
                _rename(cls, attribute, value[len(prefix) :])
            else:
                _set(cls, attribute, value, vars(cls).get(attribute))
    lazy = {}
    for attribute, value in ROWS.names.get(name, {}).items():
        if attribute in vars(module):  # one of our names: the row gives it a second form
            _set(module, attribute, value, vars(module)[attribute])
        else:
            lazy[attribute] = value
    if lazy:
        _add_lazy_names(module, lazy)


def _set(owner: Any, attribute: str, value: str, ours: Any) -> None:
    """Set the adapter ``value`` names as ``owner.attribute``; a second form of ``ours`` if we have one."""
    adapter = resolve(value)
    if isinstance(adapter, SecondForm):
        if ours is None:
            raise TypeError(f"{value} gives {attribute} a second form, but it is not ours")
        adapter = adapter.make(ours)
    elif ours is not None and ours is not adapter:
        raise TypeError(f"{value} would hide our own {attribute} (make it a second_form)")
    setattr(owner, attribute, adapter)


def _add_lazy_names(module: ModuleType, lazy: dict[str, str]) -> None:
    """PEP 562 ``__getattr__``/``__dir__`` for ``lazy`` names; they join ``__all__`` when there is one."""
    previous = vars(module).get("__getattr__")

    def __getattr__(name: str) -> Any:
        if name in lazy:
            value = resolve(lazy[name])
            setattr(module, name, value)  # looked up once
            return value
        if previous is not None:
            return previous(name)
        raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

    previous_dir = vars(module).get("__dir__")

    def __dir__() -> list[str]:
        return sorted(set(previous_dir() if previous_dir is not None else vars(module)) | set(lazy))

    module.__getattr__ = __getattr__
    module.__dir__ = __dir__
    names = vars(module).get("__all__")
    if names is None:
        module.__all__ = list(lazy)
    else:
        names.extend(n for n in lazy if n not in names)


_RENAMES: dict[type, list[tuple[str, str]]] = {}


def _link(cls: type, old: str, new: str) -> None:
    """Make ``old`` and ``new`` one attribute of ``cls`` when its body defines one of them."""
    own = vars(cls)
    if new in own and old not in own:
        setattr(cls, old, own[new])
    elif old in own and new not in own:
        setattr(cls, new, own[old])


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _rename(owner: type, old: str, new: str) -> None:
    """``old`` is ``new`` at every class level from ``owner`` down, including later subclasses."""
    if old in vars(owner):
        raise TypeError(f"{owner.__name__} spells {old} itself; the table row is its one place")
    for cls in (owner, *_subclasses(owner)):
        _link(cls, old, new)
    if old not in vars(owner):  # ours is an instance attribute or computed: forward to it
        setattr(
            owner,
            old,
            property(
                lambda self: getattr(self, new),
                lambda self, value: setattr(self, new, value),
                doc=f"Alias of ``{new}`` (a row of the compatibility table).",
            ),
        )
    if owner not in _RENAMES:
        _RENAMES[owner] = []
        previous = vars(owner).get("__init_subclass__")

        def __init_subclass__(cls: type, **kwargs: Any) -> None:
            if previous is not None:
                previous.__get__(None, cls)(**kwargs)
            else:
                super(owner, cls).__init_subclass__(**kwargs)
            for o, n in _RENAMES[owner]:
                _link(cls, o, n)

        owner.__init_subclass__ = classmethod(__init_subclass__)
    _RENAMES[owner].append((old, new))


# ---------------------------------------------------------------------- the import hook
class _Alias:
    """Loader of an old module path: the module is our module itself."""

    def __init__(self, ours: str) -> None:
        self.ours = ours

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.ours)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the import system stamped the old path's spec on it


class _Made:
    """Loader of an old module we have no counterpart for: a module holding its rows."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return ModuleType(spec.name, f"LLaMPPL's module ``{spec.name}``, made from llamppl.compat.")

    def exec_module(self, module: ModuleType) -> None:
        _install_module_rows(module, module.__name__)


class _WithRows:
    """Wraps the loader of one of our modules that has rows: they are installed after it runs."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        _install_module_rows(module, module.__spec__.name)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, is_package, ...
        return getattr(self.loader, name)


class TableFinder:
    """The ``sys.meta_path`` finder that serves :data:`ROWS` (old paths, made modules, owners)."""

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in ROWS.roots:
            return None
        ours = ROWS.our_module(fullname)
        if ours != fullname:
            if importlib.util.find_spec(ours) is None:
                return None
            return importlib.util.spec_from_loader(fullname, _Alias(ours))
        if fullname not in ROWS.owners():
            return None
        spec = self._spec_from_others(fullname, path, target)
        if spec is None:
            if fullname in ROWS.attributes:
                return None
            return importlib.machinery.ModuleSpec(fullname, _Made(), origin="llamppl.compat")
        spec.loader = _WithRows(spec.loader)
        return spec

    def _spec_from_others(
        self, fullname: str, path: Any, target: ModuleType | None
    ) -> importlib.machinery.ModuleSpec | None:
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is not self and find is not None:
                spec = find(fullname, path, target)
                if spec is not None:
                    return spec
        return None


_FINDER = TableFinder()


def install() -> None:
    """Put the finder first on ``sys.meta_path`` and give the already imported modules their rows.

    Called once at the end of ``llamppl/__init__.py``; calling it again does nothing.
    """
    if _FINDER in sys.meta_path:
        return
    sys.meta_path.insert(0, _FINDER)
    for name in sorted(ROWS.owners()):
        module = sys.modules.get(name)
        if module is not None:
            _install_module_rows(module, name)
