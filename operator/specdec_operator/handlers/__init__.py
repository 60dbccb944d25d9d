"""Kopf handlers: thin glue from events to the gather -> evaluate -> write reconcile."""
