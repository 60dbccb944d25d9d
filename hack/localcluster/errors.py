"""One error type whose message is a single line that says what to do."""


class ClusterError(RuntimeError):
    """A failure of the local control plane, with a remedy in the message."""
