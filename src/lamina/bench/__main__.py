"""``python -m lamina.bench write|read ...`` (the same as ``lamina bench ...``)."""

import sys

from . import main

sys.exit(main(sys.argv[1:]))
