"""python -m flashgdn.bench: see cli.py (or --help)."""

import sys

from .cli import main

sys.exit(main())
