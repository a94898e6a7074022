"""`kvevents` command line: a thin layer over library calls (parse, call, render).

Each submodule registers its commands on the shared app; importing them here wires them up.
"""

from kvevents.cli.app import CheckFailed, UserError, app, main, user_error
from kvevents.cli import contract, transport, consumers, logtools, nats, conformance, keys  # noqa: E402,F401  (registration)

__all__ = ["app", "main", "UserError", "CheckFailed", "user_error"]
