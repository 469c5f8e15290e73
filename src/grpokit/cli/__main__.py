"""``python -m grpokit.cli ...``: the command line (as ``grpokit`` and ``python -m grpokit``)."""

import sys

from grpokit.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
