"""``python -m cxlssd.typecheck``: mypy over the whole package, from a source checkout.

mypy finds a module by its name under a search path, so it cannot see that the
checkout's top-level folders are subpackages of ``cxlssd`` (pyproject.toml's
``package-dir``; see :mod:`cxlssd`). This hands mypy every file with the module name it
has in the package, and mypy's settings from pyproject.toml; messages name the files
as they are in the checkout.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

import cxlssd


def package_sources(checkout: Path) -> list[BuildSource]:
    """Every Python file of the checkout's package, named by its module in ``cxlssd`` and
    by its path relative to ``checkout``."""
    sources = []
    for under, root in cxlssd.package_roots():
        package = ".".join(("cxlssd", *Path(under).parts))
        if not (root / "__init__.py").is_file():
            # A namespace package (platform/): mypy looks a package's name up by folders
            # it cannot map, so it gets the package as an empty __init__.py.
            init = root.relative_to(checkout) / "__init__.py"
            sources.append(BuildSource(str(init), package, text=""))
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            sources.append(BuildSource(str(path.relative_to(checkout)), ".".join((package, *parts))))
    return sources


def main() -> int:
    checkout = cxlssd.CHECKOUT_ROOT
    if checkout is None:
        print("error: the type check runs from a source checkout (it reads pyproject.toml)", file=sys.stderr)
        return 2
    os.chdir(checkout)
    _, options = process_options(["--config-file", "pyproject.toml"], require_targets=False)
    sources = package_sources(checkout)
    try:
        messages = build.build(sources, options).errors
    except CompileError as error:
        messages = error.messages
    for line in messages:
        print(line)
    if messages:
        return 1
    print(f"Success: no issues found in {len(sources)} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
