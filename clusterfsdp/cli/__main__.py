"""`python -m clusterfsdp.cli`: the command line (as `clusterfsdp` and `python -m clusterfsdp`)."""

import sys

from . import main

sys.exit(main())
