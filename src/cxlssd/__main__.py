"""``python -m cxlssd``: the command-line interface (see :mod:`cxlssd.cli`)."""

import sys

from cxlssd.cli import main

sys.exit(main())
