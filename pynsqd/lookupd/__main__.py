"""``python -m pynsqd.lookupd``: the ``nsqlookupd`` command."""

from __future__ import annotations

import sys

from pynsqd.lookupd.cli import main

if __name__ == "__main__":
    sys.argv[0] = "nsqlookupd"  # errors read "nsqlookupd: error: ...", not "__main__.py: ..."
    main()
