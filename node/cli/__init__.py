"""The `e31` command line: the entry point (main.py, which imports only argparse, so that `e31 --help`
and `e31 inspect` start fast) and one module per command, imported only when that command is chosen
(main.py's COMMANDS). Commands talk to a running node through the api wing's client.
"""

from .main import CliError, main

__all__ = ["CliError", "main"]
