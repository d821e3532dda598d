"""``python -m pipeline.testing.simulator``."""

from .cli import main

raise SystemExit(main())
