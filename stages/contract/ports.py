"""Typed ports: the contract of every value that travels between stages.

A port has a name, a dtype ("int64", "float32", "any" ...; "int" or "bool" for a host tuple of Python values, one
per lane, that the round's layout is computed from; "record" for a typed record; "object" for an untyped handle such
as the target), named dims (defined once in docs/glossary.md; `lanes+1` is one more than `lanes`) and a device class
("device": lives where the model runs, "host": on the CPU, plain Python or a CPU tensor, "any"). A record port
names its class (`record=RowBatch`): the value must be an instance, and the tensors the class declares as its own
ports (`PORTS`) are checked like any port, sharing the round's dims; with dims `[lanes]` it is a host sequence of
such records. Edges are made from port names; `check_value` enforces a contract at run time when the executor is
asked to (tests, `--check-contracts`). Nothing here knows about stages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch

from speclane.stages.contract.errors import ContractError

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
# "float" means the model's compute dtype (bf16 or fp32), chosen at load; "object" is an untyped handle, not a tensor
# (with dims, a host sequence of handles); "record" is an instance of the port's `record` class.
ABSTRACT_DTYPES = ("float", "any", "object", "record", *HOST_DTYPES)
DEVICES = ("device", "host", "any")
# Dim names, defined in docs/glossary.md. A dim may also be a literal size.
DIM_NAMES = ("lanes", "rows", "logit_rows", "token_rows", "k", "k1", "vocab", "hidden", "taps", "slots", "events")


@attrs.frozen
class Port:
    name: str
    dtype: str = "any"
    dims: tuple[str | int, ...] | None = None  # None: not a tensor (or rank unchecked)
    device: str = "any"
    optional: bool = False  # an optional input may be absent (None) without breaking the round
    doc: str = ""
    record: type | None = None  # dtype "record": the class every value (or every entry, with dims) is an instance of

    def __attrs_post_init__(self):
        assert self.dtype in DTYPES or self.dtype in ABSTRACT_DTYPES, f"port {self.name}: dtype {self.dtype}"
        assert self.device in DEVICES, f"port {self.name}: device {self.device}"
        assert (self.dtype == "record") == (self.record is not None), f"port {self.name}: a record port names its class"

    @property
    def type_name(self) -> str:
        """The dtype as shown to people: a record port shows its class."""
        return self.record.__name__ if self.record is not None else self.dtype

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.type_name,
            "dims": list(self.dims) if self.dims is not None else None,
            "device": self.device,
            "optional": self.optional,
        }

    def compatible(self, other: "Port") -> str | None:
        """Why `self` (an input) cannot take values of `other` (an output), or None when it can. An untyped input
        ("any", "object") takes a record; a record input takes only a record of its class (or a subclass)."""
        if self.dtype == "record" or other.dtype == "record":
            if self.dtype in ("any", "object") and other.dtype == "record":
                pass
            elif other.dtype != "record" or not issubclass(other.record, self.record):
                return f"dtype {other.type_name} does not match {self.type_name}"
        elif "any" not in (self.dtype, other.dtype) and self.dtype != other.dtype:
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
    if port.record is not None:
        _check_records(port, value, sizes, where)
        return
    if port.dims is None and port.dtype in ("any", "object"):
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
    if port.device == "host" and value.device.type != "cpu":
        raise ContractError(f"{where}: port '{port.name}' is on {value.device}, the contract says the host (CPU)")
    if port.dims is None:
        return
    if value.dim() != len(port.dims):
        raise ContractError(
            f"{where}: port '{port.name}' has shape {tuple(value.shape)}, the contract says "
            f"[{', '.join(map(str, port.dims))}]"
        )
    for axis, (dim, size) in enumerate(zip(port.dims, value.shape)):
        _bind(port, dim, size, sizes, f"{where}: port '{port.name}' dim {axis}")


def _bind(port: Port, dim: str | int, size: int, sizes: dict[str, int], where: str) -> None:
    """Check `size` against a literal dim, or bind a named one (`lanes+1` binds `lanes` to size - 1)."""
    if isinstance(dim, int):
        if size != dim:
            raise ContractError(f"{where} is {size}, the contract says {dim}")
        return
    name, _, extra = dim.partition("+")
    base = size - int(extra or 0)
    if sizes.setdefault(name, base) != base:
        raise ContractError(f"{where} ('{dim}') is {size}, but '{name}' is {sizes[name]} elsewhere in this round")


def _check_records(port: Port, value: Any, sizes: dict[str, int], where: str) -> None:
    """A record (or, with dims, a host sequence of records): each an instance of the port's class, and the tensor
    fields the class declares (`PORTS`) checked as ports."""
    items = [value]
    if port.dims is not None:
        if not isinstance(value, (tuple, list)):
            raise ContractError(f"{where}: port '{port.name}' expects a host sequence, got {type(value).__name__}")
        (dim,) = port.dims
        _bind(port, dim, len(value), sizes, f"{where}: port '{port.name}' length")
        items = value
    for item in items:
        if not isinstance(item, port.record):
            raise ContractError(
                f"{where}: port '{port.name}' holds a {type(item).__name__}, the contract says {port.record.__name__}"
            )
        for field in getattr(port.record, "PORTS", ()):
            check_value(field, getattr(item, field.name), sizes, f"{where} '{port.name}' field")


def _check_host(port: Port, value: Any, sizes: dict[str, int], where: str) -> None:
    """A host sequence: a tuple or list, one entry per step of its one dim, each of the port's Python type."""
    if not isinstance(value, (tuple, list)):
        raise ContractError(f"{where}: port '{port.name}' expects a host tuple, got {type(value).__name__}")
    kind = HOST_DTYPES.get(port.dtype)
    if kind is not None and not all(isinstance(x, kind) for x in value):
        raise ContractError(f"{where}: port '{port.name}' holds a value that is not a Python {port.dtype}")
    if port.dims is not None:
        (dim,) = port.dims
        _bind(port, dim, len(value), sizes, f"{where}: port '{port.name}' length")


def ports_by_name(ports: tuple[Port, ...]) -> Mapping[str, Port]:
    return {p.name: p for p in ports}
