"""The ``nsqadmin`` command: parse flags, bind, serve on uvloop until SIGTERM/SIGINT.

Exit status: 0 after a clean shutdown (including on SIGTERM or SIGINT), 1 for a bad flag
or config file (one line on stderr) or a listener that cannot bind.
"""

from __future__ import annotations

from pynsqd.admin.config import parse_args
from pynsqd.admin.node import AdminNode
from pynsqd.daemon import command

main = command("nsqadmin", parse_args, AdminNode)
