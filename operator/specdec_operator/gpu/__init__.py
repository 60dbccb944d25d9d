"""What AMD GPUs a node has, derived from the labels AMD's node labeller writes (pure)."""
