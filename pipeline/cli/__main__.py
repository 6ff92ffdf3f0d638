"""`python -m pipeline.cli`: the `speclane` command (the server spawns itself this way)."""
import sys

from pipeline.cli import main

sys.exit(main())
