"""A finished run's id cannot run again (:func:`rayorch.store.progress.run_complete`)."""

from __future__ import annotations

from rayorch.core.errors import RayorchError
from rayorch.store.base import LineageStore
from rayorch.store.errors import RunNotFoundError
from rayorch.store.progress import run_complete


class RunFinishedError(RayorchError):
    """A run id names a run that already finished; its facts are sealed."""


def refuse_finished_run(store: LineageStore, run_id: str, store_url: str) -> None:
    """Raise :class:`RunFinishedError` (one line) when ``run_id`` is a finished run."""
    try:
        store.run_info(run_id)
    except RunNotFoundError:
        return
    if run_complete(store, run_id):
        raise RunFinishedError(
            f"run {run_id!r} already finished in {store_url}; pass another run_id (or none, "
            f"for a fresh one), or remove it first with: rayorch delete {run_id} --store "
            f"{store_url}")


__all__ = ["RunFinishedError", "refuse_finished_run"]
