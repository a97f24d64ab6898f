"""The demo wing of the node."""
