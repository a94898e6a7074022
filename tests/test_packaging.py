"""Packaging habits: the engine-side publisher stays light; one version."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import kvevents


def test_embedding_the_publisher_imports_no_cli_consumer_or_metrics_stack():
    code = (
        "import sys\n"
        "from kvevents.publisher import Publisher, PublisherConfig\n"
        "heavy = ('numpy', 'rich', 'typer', 'prometheus_client', 'fastapi', 'uvicorn', 'nats', 'cbor2', 'consumers')\n"
        "names = {m.split('.')[0] for m in sys.modules} | {m.split('.')[1] for m in sys.modules if m.startswith('kvevents.')}\n"
        "print(sorted(names & set(heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_version_is_defined_once():
    assert version("kvevents") == kvevents.__version__
