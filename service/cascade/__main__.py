"""``python -m cascade`` is the ``cascade`` command."""

import sys

from cascade.cli import main

if __name__ == "__main__":
    sys.exit(main())
