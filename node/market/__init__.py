"""The market wing of the node."""
