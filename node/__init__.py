"""e31.node: the trio program that composes e31.protocol and e31.sandbox into a node.

Its wings and the rules between them are in docs/architecture.md."""


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("e31-node")
    except PackageNotFoundError:
        return "unknown"
