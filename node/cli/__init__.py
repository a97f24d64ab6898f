"""The `e31` command line: the entry point (main.py, which imports only argparse, so that `e31 --help`
and `e31 inspect` start fast) and one module per command, imported only when that command is chosen
(main.py's COMMANDS). Commands talk to a running node through the api wing's client.

Its public names are imported lazily from their modules (node/__init__.py, `lazy_exports`).
"""

from typing import TYPE_CHECKING

from .. import lazy_exports

if TYPE_CHECKING:
    from .main import COMMANDS, CliError

__all__ = [
    "COMMANDS",
    "CliError",
]
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "COMMANDS": "main",
        "CliError": "main",
    },
)
