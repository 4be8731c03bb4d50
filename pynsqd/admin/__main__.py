"""``python -m pynsqd.admin``: the ``nsqadmin`` command."""

from __future__ import annotations

import sys

from pynsqd.admin.cli import main

if __name__ == "__main__":
    sys.argv[0] = "nsqadmin"  # errors read "nsqadmin: error: ...", not "__main__.py: ..."
    main()
