"""The api wing of the node."""
