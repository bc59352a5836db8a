"""An example external mHC implementation (see kernel.py)."""
