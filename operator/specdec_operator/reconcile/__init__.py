"""Pure reconcile evaluation: observed state in, desired objects, status and events out."""
