"""nsqlookupd: the discovery daemon. Producers (nsqd) register their topics and channels
over TCP; consumers and nsqadmin ask over HTTP who holds a topic.

This package owns the daemon: its flags (``config``), the registration DB as pure state
(``registry``), the TCP protocol adapter (``tcp``, on the sans-IO codec in
``pynsqd.wire.lookup``), the HTTP API (``http``), the lifecycle object that binds and
serves (``node``) and the ``nsqlookupd`` command (``cli``).
"""
