"""kvevents CLI commands (contract)."""

from kvevents.cli.app import app  # noqa: F401


@app.command()
def version() -> None:
    """Print the kvevents version."""
    from kvevents import __version__

    print(__version__)
