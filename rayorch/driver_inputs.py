"""What ``run()`` is given, checked before anything starts: its inputs zipped into one row per
source, ``admission_order``, ``indexed`` (a ``DriverError`` in words when they do not fit)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.plan import Plan

__all__ = ["DriverError", "check_indexed", "checked_order", "zip_inputs"]


class DriverError(RayorchError):
    """The driver was given inputs or options it cannot run."""


def zip_inputs(
    plan: Plan, inputs: Sequence[Iterable[Any]]
) -> tuple[Iterator[tuple[Any, ...]], int | None]:
    """One row per source (a value per ``forward`` argument, read lazily) and how many
    sources there are (None unless every input has a length)."""
    expected = len(plan.input_ports)
    if len(inputs) != expected:
        raise DriverError(
            f"{plan.name}.forward takes {expected} input(s) but run() got {len(inputs)}; pass "
            "one iterable per forward argument, e.g. run(pdf_paths) for forward(self, pdfs)"
        )
    sizes = [len(x) for x in inputs if hasattr(x, "__len__")]  # type: ignore[arg-type]
    if len(sizes) == len(inputs) and len(set(sizes)) > 1:
        raise DriverError(
            f"the inputs of run() have different lengths {sizes}; every forward argument "
            "needs one value per source item"
        )
    total = sizes[0] if sizes and len(sizes) == len(inputs) else None

    def rows() -> Iterator[tuple[Any, ...]]:
        try:
            yield from zip(*inputs, strict=True)
        except ValueError as exc:
            raise DriverError(
                f"the inputs of run() ran out at different lengths ({exc}); every forward "
                "argument needs one value per source item"
            ) from None

    return rows(), total


def checked_order(order: Sequence[int] | None, total: int | None) -> list[int] | None:
    """``admission_order`` as a list of distinct input positions (a ``DriverError`` if not)."""
    if order is None:
        return None
    if total is None:
        raise DriverError("admission_order needs inputs of known length (lists, not "
                          "generators)")
    positions = [int(i) for i in order]
    if len(set(positions)) != len(positions) or not all(0 <= i < total for i in positions):
        raise DriverError(f"admission_order must list distinct input positions in 0..{total - 1}")
    return positions


def check_indexed(inputs: Sequence[Any], order: Sequence[int] | None, ordered: bool,
                   identities: Sequence[str | None] | None) -> None:
    """``indexed`` replaces the inputs, their order and identities; results come as they
    finish."""
    if inputs or order is not None or identities is not None:
        raise DriverError("run(indexed=...) gives the sources with their ids and identities: "
                          "pass no other inputs, no admission_order and no identities")
    if ordered:
        raise DriverError("run(indexed=...) needs ordered=False: the ids of a streamed input "
                          "are not known up front")
