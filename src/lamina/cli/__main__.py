"""``python -m lamina.cli ...`` is the ``lamina`` command."""

import sys

from . import main

sys.exit(main())
