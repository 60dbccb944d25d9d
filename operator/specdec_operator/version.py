"""The one line both command lines print for --version: `specdec-operator` and the `kubectl specdec` plugin.

Its own module, so the plugin (fleetview.py) and the operator's command line (cli.py) share it without importing
each other.
"""

from __future__ import annotations

import sys


def version_line(prog: str = "specdec-operator") -> str:
    """The installed package's version and the API version it serves."""
    from importlib.metadata import PackageNotFoundError, version

    from specdec_operator import API_VERSION

    try:
        installed = version("specdec-operator")
    except PackageNotFoundError:  # run from a source tree without installing
        installed = "unknown"
    return f"{prog} {installed} (API {API_VERSION}, Python {sys.version.split()[0]})"
