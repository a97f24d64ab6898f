"""The net wing of the node."""
