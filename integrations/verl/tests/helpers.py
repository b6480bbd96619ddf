"""What the tests share."""


def have(module: str) -> bool:
    """Whether `module` imports (verl and torch are optional here)."""
    try:
        __import__(module)
    except ImportError:
        return False
    return True
