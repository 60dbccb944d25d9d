"""A real Kubernetes control plane as local processes, with a simulated AMD GPU fleet on KWOK.

Used by `hack/cluster up|down|status`, by the demo and by the e2e pytest fixture, so all three run the
same code path.
"""
