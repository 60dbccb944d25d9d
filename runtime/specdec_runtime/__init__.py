"""specdec-runtime: the vLLM launcher, the shared config renderer, the simulator and the fleet driver."""
