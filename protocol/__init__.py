"""e31 wire protocol: pure (sans-I/O) encoding, signing and verification of e31 messages.

Nothing in this package performs I/O, reads a clock or draws randomness on its own; time and
randomness arrive as parameters. It imports only the standard library, msgpack and nacl.
"""
