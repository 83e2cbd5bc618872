"""Placeholder replaced below."""

__all__: list[str] = []
