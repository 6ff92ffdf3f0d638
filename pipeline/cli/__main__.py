"""`python -m speclane.pipeline.cli`: the `speclane` command (the server spawns itself this way)."""

import sys

from speclane.pipeline.cli import main

sys.exit(main())
