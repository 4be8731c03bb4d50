"""nsqadmin: the cluster's web UI and its JSON API.

This package owns the ``nsqadmin`` daemon: its flags (``config``), the fan-out HTTP client
that reads every nsqlookupd and nsqd through their public HTTP APIs (``cluster``), the pure
aggregation of per-node ``/stats`` into NSQ's topic/channel shapes (``aggregate``), the
admin actions with ACL and notifications (``actions``), nsqadmin's own periodic sampling
of ``/stats`` for message-rate graphs (``sampler``), the ASGI app with the ``/api`` routes
and the pages (``http``, ``pages``, ``static/``), the lifecycle (``node``) and the command
(``cli``).
"""
