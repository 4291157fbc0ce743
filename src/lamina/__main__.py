"""``python -m lamina ...`` is the ``lamina`` command."""

import sys

from .cli import main

sys.exit(main())
