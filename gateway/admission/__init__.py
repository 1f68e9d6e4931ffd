"""Admission: the weighted fair-share queue (VTC), the backend slots, and the ``Ticket``
that is an admitted request's one hold on the backend serving it (``controller``). May
import the store, the backends' router, the metrics, the records, the errors and the
configuration.
"""
