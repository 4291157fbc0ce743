"""``python -m lamina.demo [options]``: the same as ``lamina demo``."""

import sys

from . import main

sys.exit(main(sys.argv[1:]))
