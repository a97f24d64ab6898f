"""The host wing of the node."""
