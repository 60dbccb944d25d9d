"""The thin seam to the Kubernetes API. Unit tests stub this package and nothing else."""
