"""e31 node: the trio program that composes e31.protocol and e31.sandbox, and the `e31` CLI."""
