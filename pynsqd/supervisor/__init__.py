"""The ``nsqd-supervisor`` / ``nsqd`` command: starts the node and owns its process tree."""

# Set in an upgrade's new image (``upgrade.py``): the state it takes over, the running shards
# among it; read by ``cli.py`` before anything else (an image that inherits shards forks none).
INHERITED_ENV = "PYNSQD_SUPERVISOR"
