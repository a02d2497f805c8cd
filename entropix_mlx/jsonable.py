"""JSON-ready data for `run --json`, the server and exports."""

import math


def plain(value):
    """MLX/NumPy scalars as numbers, NaN and ±inf as null (JSON has no such
    numbers, and a reader of JSON Lines must never meet one), other objects as
    their text."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
