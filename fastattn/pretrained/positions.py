"""The position tables of the pretrained families that are computed, not stored: Marian's and
M2M100's (see fastattn.nn.positions, where the modules read them)."""
from ..nn.positions import m2m100_rows, sinusoidal_m2m100, sinusoidal_marian

__all__ = ["sinusoidal_marian", "sinusoidal_m2m100", "m2m100_rows"]
