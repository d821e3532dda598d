"""``python -m pipeline.cli``: the ``refine`` command."""

import sys

from . import main

sys.exit(main())
