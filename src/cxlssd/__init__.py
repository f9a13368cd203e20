"""cxlssd: an emulated memory-semantic CXL-SSD research platform.

The import package's subpackages are the top-level folders of the repository
(``abi/``, ``platform/``, ``firmware/``, ``guest/``, ``host_os/``, ``experiments/``),
linked under ``src/cxlssd/`` so that ``platform`` never shadows the standard
library module of the same name.
"""

__version__ = "0.1.0"
