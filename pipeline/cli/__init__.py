"""The ``refine`` command line: parses arguments and calls the library, nothing more.

::

    parser     the argument parser, one builder per subcommand; the settings it asks for
    commands   what each subcommand does (calls into ``pipeline``) and prints
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from ..errors import AuthError, RefineError, StoreError
from ..runs.exits import EXIT
from .commands import COMMANDS, Console
from .parser import build_parser, settings_from_args

__all__ = ["build_parser", "main", "settings_from_args"]

log = logging.getLogger("refine")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``refine`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # Only our own logger speaks on the console: HTTP libraries log every request at INFO.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("refine: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.WARNING if getattr(args, "quiet", False) else logging.INFO)
    log.propagate = False
    try:
        return COMMANDS[args.command](args)
    except StoreError as err:
        Console.print(f"refine: error: {err}", file=sys.stderr)
        return EXIT["store"]
    except AuthError as err:
        Console.print(f"refine: error: {err}", file=sys.stderr)
        return EXIT["auth"]
    except RefineError as err:
        Console.print(f"refine: error: {err}", file=sys.stderr)
        return EXIT["config"]
    except KeyboardInterrupt:
        Console.print("refine: interrupted", file=sys.stderr)
        return EXIT["interrupted"]
