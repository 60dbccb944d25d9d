"""`python -m specdec_runtime.simulator serve MODEL ... --profile FILE`: the args `serve_args()` renders."""

from __future__ import annotations

import sys

from specdec_runtime.simulator.server import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
