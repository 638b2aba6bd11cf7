"""``python -m relpos_ref``: the same as the ``relpos-ref`` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
