"""Canary rollouts: analysis verdicts, the durable step state machine and HTTPRoute weights (all pure)."""
