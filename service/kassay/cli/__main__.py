"""`python -m kassay.cli ...`: the `kassay` command without its console script (the API's
embedded workers start that way)."""

import sys

from kassay.cli import main

sys.exit(main())
