"""Kubernetes quantities (500Gi, 2T, 1e12) as byte counts.

The kubernetes client's parser is not used so that this module stays importable where
only the CLI's extras are installed; the spec's pattern has already admitted the value.
"""

from __future__ import annotations

import re

_SUFFIX_FACTORS = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "m": 10**-3, "u": 10**-6, "n": 10**-9,
}  # fmt: skip
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:([eE][+-]?\d+)|([KMGTPE]i|[numkMGTPE])?)$"
)


def quantity_bytes(value: int | str) -> int:
    """A Kubernetes quantity (500Gi, 2T, 1e12) in bytes, rounded down."""
    if isinstance(value, int):
        return value
    match = _QUANTITY.fullmatch(value)
    if match is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity such as 500Gi")
    number, exponent, suffix = match.groups()
    if exponent:
        return int(float(number + exponent))
    return int(float(number) * _SUFFIX_FACTORS[suffix or ""])
