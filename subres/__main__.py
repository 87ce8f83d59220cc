"""`python -m subres`."""

import sys

from subres.main import main

sys.exit(main())
