"""cxlssd: an emulated memory-semantic CXL-SSD research platform.

The package's subpackages are the repository's top-level folders (``abi/``,
``platform/``, ``firmware/``, ``guest/``, ``host_os/``, ``experiments/``), mapped into
``cxlssd`` by the ``package-dir`` table of ``pyproject.toml``: a wheel holds them as
``cxlssd/platform/`` and so on. Run from a source checkout (``./cxlssd``, or with
``src`` on ``sys.path``), the same table tells :class:`_CheckoutFinder` where they are,
so nothing is linked or copied. ``platform/`` has no ``__init__.py``: with the
repository root on ``sys.path`` (``python -m pytest`` there) a bare ``import platform``
must still find the standard library's module, and a folder without one never wins
over a module.
"""

from __future__ import annotations

import os
import sys
import tomllib
from collections.abc import Mapping, Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from importlib.util import spec_from_file_location
from pathlib import Path
from types import ModuleType

__version__ = "0.1.0"


def _checkout_root() -> Path | None:
    """The source checkout this package runs from (``src/cxlssd/`` below a directory with
    ``pyproject.toml``), or None for an installed package."""
    package = Path(__file__).resolve().parent
    root = package.parents[1]
    if package.parent.name == "src" and (root / "pyproject.toml").is_file():
        return root
    return None


CHECKOUT_ROOT = _checkout_root()


def package_roots() -> list[tuple[str, Path]]:
    """Where the package's files are: (path under the package, directory) pairs, the
    package's own directory first. A file has the same path under the package either way
    (``platform/config.py``): installed, the one directory holds every subpackage; in a
    checkout, each subpackage is its top-level folder."""
    roots = [("", Path(__file__).resolve().parent)]
    return roots + sorted(_CHECKOUT_SUBPACKAGES.items())


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the directory this package was imported from
    first on ``PYTHONPATH``: a ``python -m cxlssd...`` child runs this same code, however
    this process found it (``./cxlssd``, pytest's ``pythonpath``, an installed wheel)."""
    env = dict(os.environ if env is None else env)
    here = str(Path(__file__).resolve().parents[1])
    rest = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path and path != here]
    env["PYTHONPATH"] = os.pathsep.join([here, *rest])
    return env


def _read_package_dir(root: Path) -> dict[str, Path]:
    """pyproject.toml's ``[tool.setuptools.package-dir]``, as folders of the checkout by
    subpackage name (the core package, ``src/cxlssd``, is not a subpackage)."""
    table = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = {}
    for name, folder in table.items():
        if name == __name__:
            continue
        subpackage = name.removeprefix(__name__ + ".")
        if "." not in subpackage:  # deeper packages are found in their parent's folder
            found[subpackage] = root / folder
    return found


class _CheckoutFinder(MetaPathFinder):
    """Imports ``cxlssd.<name>`` from the checkout's folder ``<name>/`` (only those names:
    the rest of the checkout is not part of the package)."""

    def __init__(self, folders: dict[str, Path]) -> None:
        self._folders = {f"{__name__}.{name}": path for name, path in folders.items()}

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        folder = self._folders.get(fullname)
        if folder is None:
            return None
        init = folder / "__init__.py"
        if init.is_file():
            return spec_from_file_location(fullname, init, submodule_search_locations=[str(folder)])
        spec = ModuleSpec(fullname, None, is_package=True)  # a namespace package (platform/)
        spec.submodule_search_locations = [str(folder)]
        return spec


_CHECKOUT_SUBPACKAGES: dict[str, Path] = {}
if CHECKOUT_ROOT is not None:
    _CHECKOUT_SUBPACKAGES = _read_package_dir(CHECKOUT_ROOT)
    # First: an editable install of another checkout (its finder) must not answer for this one.
    sys.meta_path.insert(0, _CheckoutFinder(_CHECKOUT_SUBPACKAGES))
