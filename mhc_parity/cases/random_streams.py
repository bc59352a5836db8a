"""Machine-independent random numbers for fixtures, bit-identical on every machine.

Each array role ("x", "weights.pre_alpha", ...) has its own PCG64 generator seeded from
``SeedSequence([seed, crc32(role)])``, so adding an array never shifts the others. Only
correctly rounded operations (+, -, ×, ÷, sqrt) and power-of-two scalings touch the bits:
libm exp/log differ between machines in the last bit, hence Irwin–Hall `normalish` rather
than `Generator.standard_normal` (whose ziggurat calls exp/log).
"""

from __future__ import annotations

import math
import zlib

import numpy as np

# Irwin–Hall with k uniforms has variance k/12: scaled by sqrt(12/k), unit variance.
_IRWIN_HALL_TERMS = 4
_IRWIN_HALL_SCALE = math.sqrt(12.0 / _IRWIN_HALL_TERMS)
_CHUNK_ELEMENTS = 1 << 20


def role_generator(seed: int, role: str) -> np.random.Generator:
    """The generator for one array role of one seed (PCG64, platform independent)."""
    sequence = np.random.SeedSequence([int(seed), zlib.crc32(role.encode("utf-8"))])
    return np.random.Generator(np.random.PCG64(sequence))


def normalish(rng: np.random.Generator, shape) -> np.ndarray:
    """Float64 array of `shape`, mean 0, variance 1, bounded by ±2√3 ≈ ±3.46 (drawn in chunks)."""
    shape = tuple(int(d) for d in shape)
    size = math.prod(shape)
    out = np.empty(size, np.float64)
    for start in range(0, size, _CHUNK_ELEMENTS):
        stop = min(size, start + _CHUNK_ELEMENTS)
        u = rng.random((_IRWIN_HALL_TERMS, stop - start))
        total = ((u[0] + u[1]) + u[2]) + u[3]  # fixed summation order
        out[start:stop] = (total - _IRWIN_HALL_TERMS / 2.0) * _IRWIN_HALL_SCALE
    return out.reshape(shape)


def uniform(rng: np.random.Generator, shape, low: float, high: float) -> np.ndarray:
    """Float64 uniform on [low, high) of `shape`."""
    return low + (high - low) * rng.random(tuple(shape))


def random_signs(rng: np.random.Generator, shape) -> np.ndarray:
    """Float64 array of ±1.0 with equal probability."""
    return np.where(rng.random(tuple(shape)) < 0.5, -1.0, 1.0)


def powers_of_two(rng: np.random.Generator, shape, low_exponent: int, high_exponent: int) -> np.ndarray:
    """Float64 2**k with integer k uniform in [low_exponent, high_exponent] (exact values)."""
    exponents = rng.integers(low_exponent, high_exponent, size=tuple(shape), endpoint=True)
    return np.ldexp(np.ones(tuple(shape)), exponents)


class RandomStreams:
    """Named, independent random streams of one seed: ``streams.normal("x", shape)``. Drawing a
    role twice raises ValueError (it would correlate arrays)."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self._used: set[str] = set()

    def generator(self, role: str) -> np.random.Generator:
        if role in self._used:
            raise ValueError(f"random role {role!r} drawn twice for seed {self.seed}")
        self._used.add(role)
        return role_generator(self.seed, role)

    def normal(self, role: str, shape, std: float = 1.0, mean: float = 0.0) -> np.ndarray:
        return mean + std * normalish(self.generator(role), shape)

    def uniform(self, role: str, shape, low: float, high: float) -> np.ndarray:
        return uniform(self.generator(role), shape, low, high)

    def signs(self, role: str, shape) -> np.ndarray:
        return random_signs(self.generator(role), shape)

    def powers_of_two(self, role: str, shape, low_exponent: int, high_exponent: int) -> np.ndarray:
        return powers_of_two(self.generator(role), shape, low_exponent, high_exponent)

    def integers(self, role: str, low: int, high: int, shape=()) -> np.ndarray:
        """Integers uniform in [low, high)."""
        return self.generator(role).integers(low, high, size=shape)
