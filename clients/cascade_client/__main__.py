"""``python -m cascade_client compress|decompress|kcbs ...`` (the same as ``cascade ...``)."""

import sys

from cascade_client.cli import main

sys.exit(main(sys.argv[1:]))
