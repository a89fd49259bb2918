"""``python -m pyro_bbb``: see :mod:`pyro_bbb.cli`."""

import sys

from .cli import main

sys.exit(main())
