"""`kvevents` command line: a thin layer over library calls (parse, call, render).

Each submodule registers its commands on the shared app; importing them here wires them up.
"""

from kvevents.cli import conformance, consumers, contract, keys, logtools, nats, relay, transport  # noqa: E402,F401  (registration)
from kvevents.cli.app import CheckFailed, UserError, app, main, user_error

__all__ = ["app", "main", "UserError", "CheckFailed", "user_error"]
