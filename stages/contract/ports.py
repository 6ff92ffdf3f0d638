"""Typed ports: the contract of every value that travels between stages.

A port has a name, a dtype ("int64", "float32", "any" ...; "int" or "bool" for a host tuple of Python values, one
per lane, that the round's layout is computed from; "object" for host handles such as the lane table),
named dims (defined once in docs/glossary.md) and a device class ("device": lives where the model runs, "host":
plain Python on the CPU, "any"). Edges are made from port names; `check_value` enforces a contract at run time
when the executor is asked to (tests, `--check-contracts`). Nothing here knows about stages.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch

from stages.contract.errors import ContractError

DTYPES = {
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# Host sequences (a tuple or list) of Python values, checked element by element; dims give their length.
HOST_DTYPES = {"int": int, "bool": bool}
# "float" means the model's compute dtype (bf16 or fp32), chosen at load; "object" is a host handle, not a tensor
# (with dims, a host sequence of handles: the lanes of a round).
ABSTRACT_DTYPES = ("float", "any", "object", *HOST_DTYPES)
DEVICES = ("device", "host", "any")
# Dim names, defined in docs/glossary.md. A dim may also be a literal size.
DIM_NAMES = ("lanes", "rows", "k", "k1", "vocab", "hidden", "taps", "slots")


@attrs.frozen
class Port:
    name: str
    dtype: str = "any"
    dims: tuple[str | int, ...] | None = None  # None: not a tensor (or rank unchecked)
    device: str = "any"
    optional: bool = False  # an optional input may be absent (None) without breaking the round
    doc: str = ""

    def __attrs_post_init__(self):
        assert self.dtype in DTYPES or self.dtype in ABSTRACT_DTYPES, f"port {self.name}: dtype {self.dtype}"
        assert self.device in DEVICES, f"port {self.name}: device {self.device}"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "dims": list(self.dims) if self.dims is not None else None,
                "device": self.device, "optional": self.optional}

    def compatible(self, other: "Port") -> str | None:
        """Why `self` (an input) cannot take values of `other` (an output), or None when it can."""
        if "any" not in (self.dtype, other.dtype) and self.dtype != other.dtype:
            return f"dtype {other.dtype} does not match {self.dtype}"
        if self.dims is not None and other.dims is not None and tuple(self.dims) != tuple(other.dims):
            return f"dims [{', '.join(map(str, other.dims))}] do not match [{', '.join(map(str, self.dims))}]"
        if "any" not in (self.device, other.device) and self.device != other.device:
            return f"device class {other.device} does not match {self.device}"
        return None


def check_value(port: Port, value: Any, sizes: dict[str, int], where: str) -> None:
    """Raise ContractError when `value` breaks `port`'s contract; bind named dims into `sizes` as they are seen."""
    if value is None:
        if port.optional:
            return
        raise ContractError(f"{where}: port '{port.name}' is None but is not optional")
    if port.dims is None:
        return
    if port.dtype == "object" or port.dtype in HOST_DTYPES:
        _check_host(port, value, sizes, where)
        return
    if not isinstance(value, torch.Tensor):
        raise ContractError(f"{where}: port '{port.name}' expects a tensor, got {type(value).__name__}")
    want = DTYPES.get(port.dtype)
    if want is not None and value.dtype != want:
        raise ContractError(f"{where}: port '{port.name}' has dtype {value.dtype}, the contract says {port.dtype}")
    if port.dtype == "float" and not value.is_floating_point():
        raise ContractError(f"{where}: port '{port.name}' has dtype {value.dtype}, the contract says a float")
    if value.dim() != len(port.dims):
        raise ContractError(
            f"{where}: port '{port.name}' has shape {tuple(value.shape)}, the contract says "
            f"[{', '.join(map(str, port.dims))}]")
    for axis, (dim, size) in enumerate(zip(port.dims, value.shape)):
        if isinstance(dim, int):
            if size != dim:
                raise ContractError(f"{where}: port '{port.name}' dim {axis} is {size}, the contract says {dim}")
        elif sizes.setdefault(dim, size) != size:
            raise ContractError(
                f"{where}: port '{port.name}' dim {axis} ('{dim}') is {size}, but '{dim}' is {sizes[dim]} "
                f"elsewhere in this round")


def _check_host(port: Port, value: Any, sizes: dict[str, int], where: str) -> None:
    """A host sequence: a tuple or list, one entry per step of its one dim, each of the port's Python type."""
    if not isinstance(value, (tuple, list)):
        raise ContractError(f"{where}: port '{port.name}' expects a host tuple, got {type(value).__name__}")
    kind = HOST_DTYPES.get(port.dtype)
    if kind is not None and not all(isinstance(x, kind) for x in value):
        raise ContractError(f"{where}: port '{port.name}' holds a value that is not a Python {port.dtype}")
    (dim,) = port.dims
    if isinstance(dim, int) and len(value) != dim:
        raise ContractError(f"{where}: port '{port.name}' has {len(value)} entries, the contract says {dim}")
    if not isinstance(dim, int) and sizes.setdefault(dim, len(value)) != len(value):
        raise ContractError(f"{where}: port '{port.name}' has {len(value)} entries ('{dim}'), but '{dim}' is "
                            f"{sizes[dim]} elsewhere in this round")


def ports_by_name(ports: tuple[Port, ...]) -> Mapping[str, Port]:
    return {p.name: p for p in ports}
