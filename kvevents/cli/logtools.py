"""kvevents CLI commands (tools): `record`, `log inspect|repair|export`, `replay`, `doctor`.

The commands live in logtools_* modules; importing them registers them on the shared app.
"""

from kvevents.cli.app import app
from kvevents.cli.logtools_log import log_app

app.add_typer(log_app, name="log")

from kvevents.cli import logtools_doctor, logtools_live  # noqa: E402,F401  (registration)
