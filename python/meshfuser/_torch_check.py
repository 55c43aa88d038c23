"""meshfuser's extension is compiled against one PyTorch (C++ ABI): importing it with another is
refused here with both versions named, instead of an undefined-symbol error or a crash."""


def _release(version):
    """"2.13.0+cpu" -> (2, 13, 0)."""
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def check(built_with, imported):
    """Raises ImportError when `built_with` and `imported` torch versions differ in major.minor."""
    if built_with and _release(built_with)[:2] != _release(imported)[:2]:
        raise ImportError(
            f"meshfuser was built against torch {built_with} but this Python imports torch {imported}; its C++ "
            "extension only works with the torch it was built with. Rebuild it here: pip install --no-build-isolation . "
            "(or ./scripts/setup in a checkout), or install the torch it was built with")


def import_extension():
    import torch
    try:
        from . import _C
    except ImportError as e:
        raise ImportError(
            f"meshfuser's C++ extension failed to load with torch {torch.__version__} ({e}). It must be built "
            "against the torch it runs with: rebuild it (pip install --no-build-isolation . or ./scripts/setup)") from e
    check(getattr(_C, "_built_with_torch", ""), torch.__version__)
    return _C
