"""`python -m fleetwarden.cli ...`: the same as the `fleetwarden` console script."""

import sys

from fleetwarden.cli import main

sys.exit(main())
