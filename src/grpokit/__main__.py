"""``python -m grpokit ...`` runs the command line, as the ``grpokit`` script does."""

import sys

from grpokit.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
