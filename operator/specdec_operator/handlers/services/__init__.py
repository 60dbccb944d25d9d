"""The operator-wide services: what runs beside the per-model reconcile passes, not inside one.

The watch caches and the watches that fill them, the scrape scheduler, the background-loop supervisor, leadership
tracking, the authenticated /metrics server, namespace discovery, memory release and the shutdown path. A per-pass
step (handlers/reconciler.py, tuning.py, traffic.py, writes.py, resync.py) may use a service; no service calls a step.
"""
