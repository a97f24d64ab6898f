"""The store wing of the node."""
