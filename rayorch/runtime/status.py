"""A finished run's id cannot run again (its progress: :mod:`rayorch.inspect.status`)."""

from __future__ import annotations

from rayorch.core.errors import RayorchError
from rayorch.inspect.status import run_status
from rayorch.store.base import LineageStore
from rayorch.store.errors import RunNotFoundError


class RunFinishedError(RayorchError):
    """A run id names a run that already finished; its facts are sealed."""


def refuse_finished_run(store: LineageStore, run_id: str, store_url: str) -> None:
    """Raise :class:`RunFinishedError` (one line) when ``run_id`` is a finished run."""
    try:
        store.run_info(run_id)
    except RunNotFoundError:
        return
    if run_status(store, run_id).complete:
        raise RunFinishedError(
            f"run {run_id!r} already finished in {store_url}; pass another run_id (or none, "
            f"for a fresh one), or remove it first with: rayorch delete {run_id} --store "
            f"{store_url}")


__all__ = ["RunFinishedError", "refuse_finished_run"]
