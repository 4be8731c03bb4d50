"""``pynsqd.tools``: NSQ's utilities as console scripts, with NSQ's flags and defaults.

``nsq_tail``, ``nsq_to_file``, ``nsq_to_http``, ``nsq_to_nsq``, ``to_nsq`` and ``nsq_stat``
are thin programs over ``pynsqd.client``. ``common`` holds what they share: the consumer
flags, ``--consumer-opt``/``--producer-opt`` parsing, and the run loop whose SIGINT/SIGTERM
handlers only set an event, so each tool stops in its own order (stop taking messages,
finish writing, answer what it wrote, exit 0). Flags are parsed by ``pynsqd.options`` like
the daemons': a bad one is one line on stderr and exit status 1.
"""
