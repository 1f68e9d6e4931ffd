"""The relay: a request sent to a backend and its answer relayed back. ``dispatch``
(the backends tried in the router's order, failover before the first byte, the hold
moved to each), ``tagging`` (the body each backend receives), ``streaming`` (the SSE
relay and what it measures), ``read_deadline`` and ``interruptible`` (a stream's read
deadlines on one timer). May import admission (the ticket it moves), the backends, the
store, the metrics, the records, the errors and the configuration.
"""
