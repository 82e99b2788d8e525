"""Build-time helpers imported by setup.py only (not shipped in the wheel)."""
