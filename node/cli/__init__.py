"""The cli wing of the node."""
