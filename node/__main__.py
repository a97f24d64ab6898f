"""`python -m e31.node` runs the e31 command line."""

import sys

from e31.node.cli.main import main

sys.exit(main())
