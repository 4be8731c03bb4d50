"""The ``nsqd-supervisor`` / ``nsqd`` command: starts the node and owns its process tree."""
