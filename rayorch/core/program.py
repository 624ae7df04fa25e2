"""The program API: ``RayModule`` and the pipeline base class (Torch-like).

Example::

    class Parse(ro.Pipeline):
        def __init__(self):
            super().__init__()
            self.render = ro.RayModule(Render, batch_size=4)
            self.ocr = ro.RayModule(Ocr, model="tiny", batch_size=64, num_gpus=1)

        def forward(self, pdfs):
            pages = F.expand(self.render(pdfs))
            return F.reduce(self.ocr(pages))
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

from rayorch.core import compile_errors as ce
from rayorch.core.names import module_name_problem
from rayorch.core.plan import ModuleOptions, ModuleSpec, Plan, Policy
from rayorch.core.tracer import Port, active_trace, caller_location

_OPTION_NAMES = frozenset(
    {
        "replicas",
        "batch_size",
        "num_cpus",
        "num_gpus",
        "resources",
        "max_attempts",
        "timeout_s",
        "policy",
        "batched",
        "num_outputs",
    }
)


def _target_name(target: Any) -> str:
    module = getattr(target, "__module__", "?")
    name = getattr(target, "__qualname__", type(target).__name__)
    return f"{module}.{name}"


class RayModule:
    """A user class or function executed by a Ray actor pool.

    ``RayModule(Ocr, model="m", batch_size=64, num_gpus=1)``: the execution options
    (``replicas``, ``batch_size``, ``num_cpus``, ``num_gpus``, ``resources``,
    ``max_attempts``, ``timeout_s``, ``policy`` = ``"elastic"`` | ``"parent_bound"``,
    ``batched``, ``num_outputs``) are taken out; every other argument goes to the
    class constructor (or is bound as a keyword of the function). One RayModule
    called at several places of ``forward`` shares one pool.
    """

    def __init__(
        self,
        target: Any,
        *args: Any,
        replicas: int = 1,
        batch_size: int = 1,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        resources: Mapping[str, float] | None = None,
        max_attempts: int = 3,
        timeout_s: float | None = None,
        policy: str | Policy = Policy.ELASTIC,
        batched: bool = True,
        num_outputs: int = 1,
        **kwargs: Any,
    ) -> None:
        location = caller_location()
        if not callable(target):
            raise ce.ModuleDefinitionError(
                f"RayModule target {target!r:.60} is not a class or a function",
                location,
                "pass the class (not an instance) or a function: ro.RayModule(MyClass, ...)",
            )
        checks = [
            (replicas >= 1, f"replicas={replicas}", "replicas must be >= 1"),
            (batch_size >= 1, f"batch_size={batch_size}", "batch_size must be >= 1"),
            (max_attempts >= 1, f"max_attempts={max_attempts}", "max_attempts must be >= 1"),
            (num_outputs >= 1, f"num_outputs={num_outputs}", "num_outputs must be >= 1"),
            (
                num_cpus >= 0 and num_gpus >= 0,
                "negative resources",
                "num_cpus/num_gpus must be >= 0",
            ),
            (timeout_s is None or timeout_s > 0, f"timeout_s={timeout_s}", "timeout_s must be > 0"),
        ]
        for ok, what, fix in checks:
            if not ok:
                raise ce.ModuleDefinitionError(f"invalid option {what}", location, fix)
        try:
            policy = Policy(policy)
        except ValueError:
            raise ce.ModuleDefinitionError(
                f"unknown policy {policy!r}",
                location,
                "use policy='elastic' or policy='parent_bound'",
            ) from None
        self.target = target
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self.options = ModuleOptions(
            replicas=replicas,
            batch_size=batch_size,
            num_cpus=float(num_cpus),
            num_gpus=float(num_gpus),
            resources=tuple(sorted((resources or {}).items())),
            max_attempts=max_attempts,
            timeout_s=timeout_s,
            policy=policy,
            batched=batched,
            num_outputs=num_outputs,
        )

    def spec(self, name: str) -> ModuleSpec:
        return ModuleSpec(
            name=name,
            target=self.target,
            args=self.args,
            kwargs=tuple(sorted(self.kwargs.items())),
            options=self.options,
            target_name=_target_name(self.target),
        )

    def __call__(self, *ports: Any, **static_kwargs: Any) -> Any:
        """Record a Call of this module (only inside ``forward``)."""
        trace = active_trace("a RayModule call")
        outs = trace.add_call(id(self), ports, static_kwargs, self.options.num_outputs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def __repr__(self) -> str:
        return f"RayModule({_target_name(self.target)}, {self.options})"


class PipelineBase:
    """Base of user pipelines: registers modules, traces ``forward`` into a Plan.

    The arguments of the outermost ``__init__`` call are kept (see
    :func:`constructor_args`) so that a run can record how to rebuild the pipeline.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "__rayorch_records_args__", False):
            return

        @functools.wraps(init)
        def recording_init(self: PipelineBase, *args: Any, **kw: Any) -> None:
            if "_init_args" not in self.__dict__:  # the outermost call only
                object.__setattr__(self, "_init_args", (tuple(args), dict(kw)))
            init(self, *args, **kw)

        recording_init.__rayorch_records_args__ = True  # type: ignore[attr-defined]
        cls.__init__ = recording_init  # type: ignore[method-assign]

    def __init__(self) -> None:
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_plan", None)

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, (RayModule, PipelineBase)):
            modules = self.__dict__.get("_modules")
            if modules is None:
                raise ce.ModuleDefinitionError(
                    f"module {name!r} assigned before Pipeline.__init__ ran",
                    caller_location(),
                    "call super().__init__() first in your pipeline's __init__",
                )
            problem = module_name_problem(name)
            if problem is not None:
                raise ce.ModuleDefinitionError(
                    problem, caller_location(),
                    "assign the module to a plain attribute, e.g. self.ocr = RayModule(...)")
            modules[name] = value
            self.__dict__["_plan"] = None
        object.__setattr__(self, name, value)

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, RayModule]]:
        """``(dotted_name, module)`` for every RayModule, in assignment order."""
        for name, value in self.__dict__.get("_modules", {}).items():
            dotted = f"{prefix}{name}"
            if isinstance(value, RayModule):
                yield dotted, value
            else:
                yield from value.named_modules(dotted + ".")

    def forward(self, *inputs: Any) -> Any:
        raise ce.ModuleDefinitionError(
            f"{type(self).__name__} has no forward()",
            None,
            "define forward(self, ...) wiring modules with F.expand / F.reduce",
        )

    def __call__(self, *ports: Any) -> Any:
        """Inline a sub-pipeline's ``forward`` while tracing an outer one."""
        active_trace(f"sub-pipeline {type(self).__name__}")
        return self.forward(*ports)

    def compile(self) -> Plan:
        """Trace ``forward`` once and check it; the Plan is cached."""
        plan = self.__dict__.get("_plan")
        if plan is None:
            from rayorch.core.compiler import compile_pipeline

            plan = compile_pipeline(self)
            self.__dict__["_plan"] = plan
        return plan


def constructor_args(pipeline: PipelineBase) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The ``(args, kwargs)`` the pipeline's outermost ``__init__`` was called with."""
    recorded: tuple[tuple[Any, ...], dict[str, Any]] = pipeline.__dict__.get(
        "_init_args", ((), {}))
    return recorded


__all__ = ["PipelineBase", "Port", "RayModule", "constructor_args"]
