"""Pure decisions: placement, drafter choice and runtime environment, from observed data only."""
