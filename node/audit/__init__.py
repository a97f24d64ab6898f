"""The audit wing of the node."""
