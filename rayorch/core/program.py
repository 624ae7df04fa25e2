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
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

from rayorch.core import compile_errors as ce
from rayorch.core.ast_lock import signature as locked_signature
from rayorch.core.names import module_name_problem
from rayorch.core.plan import ModuleOptions, ModuleSpec, Plan, Policy
from rayorch.core.pool_sizing import AUTO_MAX_REPLICAS
from rayorch.core.recovery import RecoveryError, as_policy
from rayorch.core.sizes import parse_byte_size
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
        "recovery",
        "output_layout",
        "max_inflight",
        "max_rss",
        "max_batches",
        "keep_values",
    }
)
"""Execution options: rayorch's own, set flat or through ``ray_options``."""

RAY_ACTOR_OPTIONS = frozenset(
    {
        "_labels",
        "accelerator_type",
        "enable_task_events",
        "enable_tensor_transport",
        "fallback_strategy",
        "label_selector",
        "max_pending_calls",
        "max_restarts",
        "memory",
        "object_store_memory",
        "placement_group",
        "placement_group_bundle_index",
        "placement_group_capture_child_tasks",
        "runtime_env",
        "scheduling_strategy",
    }
)
"""``ray.remote`` actor options passed through unchanged (the core imports no ray; a unit
test compares this list with Ray's own)."""

RESERVED_RAY_OPTIONS = {
    "name": "rayorch names the pool's actors itself",
    "namespace": "rayorch names the pool's actors itself",
    "lifetime": "rayorch owns the actors' lifetime",
    "get_if_exists": "rayorch finds shared actors itself",
    "max_concurrency": "set max_inflight=N (batches one actor runs at once)",
    "concurrency_groups": "set max_inflight=N (batches one actor runs at once)",
    "allow_out_of_order_execution": "an actor runs its batches in order",
    "max_task_retries": "rayorch retries batches itself (max_attempts, recovery=)",
    "_actor_generator_backpressure_num_objects": "rayorch actors are not generators",
}

_DEFAULT_MAX_ATTEMPTS = 3


def _target_name(target: Any) -> str:
    module = getattr(target, "__module__", "?")
    name = getattr(target, "__qualname__", type(target).__name__)
    return f"{module}.{name}"


def _wrong_option(what: str, location: Any, fix: str) -> ce.ModuleDefinitionError:
    return ce.ModuleDefinitionError(what, location, fix)


Replicas = int | tuple[int, int] | str
"""``replicas=``: N actors, ``(min, max)`` or ``"auto"`` (docs/topics/POOL-SIZING.md, "Pools that
size themselves")."""


def parse_replicas(text: str) -> Replicas:
    """``replicas`` as a command line gives it: ``4``, ``1-8`` (min-max) or ``auto``;
    :class:`ValueError` saying the forms otherwise."""
    low, dash, high = text.strip().partition("-")
    try:
        if text.strip() == "auto":
            return "auto"
        value: int | tuple[int, int] = (int(low), int(high)) if dash else int(low)
        _replica_range(value, None)
    except (ValueError, ce.ModuleDefinitionError):
        raise ValueError(f"{text!r:.40}: give a number of actors (4), a range min-max (1-8) "
                         "or auto") from None
    return value


def _replica_range(value: Any, location: Any) -> tuple[int, int | None]:
    """``replicas`` as (actors at the start, max or None for a fixed pool)."""
    if _is_int(value) and value >= 1:
        return value, None
    if value == "auto":
        return 1, AUTO_MAX_REPLICAS
    if (isinstance(value, (tuple, list)) and len(value) == 2 and all(map(_is_int, value))
            and 1 <= value[0] <= value[1]):
        low, high = value
        return low, (None if low == high else high)
    raise ce.ModuleDefinitionError(
        f"invalid option replicas={value!r:.60}", location,
        "replicas is an int >= 1 (that many actors), a pair (min, max) with 1 <= min <= max "
        "(the pool sizes itself between them), or \"auto\" (from 1 actor up to what the "
        "cluster has free)")


class RayModule:
    """A user class or function executed by a Ray actor pool.

    Three namespaces, never mixed (docs/ARCHITECTURE.md, "Upstream compatibility"):

    * execution options (``replicas``: an int for a fixed pool, ``(min, max)`` or
      ``"auto"`` for one that sizes itself; ``batch_size``, ``num_cpus``, ``num_gpus``,
      ``resources``, ``max_attempts``, ``timeout_s``, ``policy`` = ``"elastic"`` |
      ``"parent_bound"``, ``batched``, ``num_outputs``, ``recovery``, ``output_layout``,
      ``max_inflight``: batches one actor runs at once, default 1; an ``async def``
      ``__call__`` runs them as coroutines on one event loop, a plain one in threads;
      ``max_rss`` (bytes, or ``"1.5GB"``) and ``max_batches``: an actor past either
      finishes its batches, then is replaced by a fresh one, its *recycling*;
      ``keep_values``: its outputs stay with the run's lineage after their source is
      delivered, never freed: a data-quality stage's verdicts, why a document is gone);
    * Ray actor options (``runtime_env``, ``memory``, ``max_restarts``,
      ``accelerator_type``, ``scheduling_strategy``, ``label_selector``, ...), given as
      ``ray_options={...}`` and passed to ``ray.remote(...).options`` unchanged;
    * the constructor's arguments: every other argument, or ``.pre_init(*args, **kw)``.

    A keyword that is neither an option nor a parameter of the constructor is an error
    at this line, never a silent constructor argument. Upstream RayOrch's builder works
    too: ``RayModule(X).pre_init(...).ray_options(replicas=2, num_gpus=1,
    runtime_env=...).returns(2)``. One RayModule called at several places of
    ``forward`` shares one pool.
    """

    def __init__(
        self,
        target: Any,
        *args: Any,
        replicas: Replicas = 1,
        batch_size: int = 1,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        resources: Mapping[str, float] | None = None,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        policy: str | Policy = Policy.ELASTIC,
        batched: bool = True,
        num_outputs: int = 1,
        recovery: Any = None,
        output_layout: str | None = None,
        max_inflight: int = 1,
        max_rss: int | str | None = None,
        max_batches: int | None = None,
        keep_values: bool = False,
        ray_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        location = caller_location()
        if not callable(target):
            raise ce.ModuleDefinitionError(
                f"RayModule target {target!r:.60} is not a class or a function",
                location,
                "pass the class (not an instance) or a function: ro.RayModule(MyClass, ...)",
            )
        self.target = target
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self._exec: dict[str, Any] = {
            "replicas": replicas, "batch_size": batch_size, "num_cpus": num_cpus,
            "num_gpus": num_gpus, "resources": resources, "max_attempts": max_attempts,
            "timeout_s": timeout_s, "policy": policy, "batched": batched,
            "num_outputs": num_outputs, "recovery": recovery, "output_layout": output_layout,
            "max_inflight": max_inflight, "max_rss": max_rss, "max_batches": max_batches,
            "keep_values": keep_values,
        }
        self._ray: dict[str, Any] = {}
        self._check_constructor(location, explicit=False)
        if ray_options:
            self._route(dict(ray_options), location, "ray_options")
        self.options = self._build(location)

    # -- upstream RayOrch's builder ------------------------------------------------
    def pre_init(self, *args: Any, **kwargs: Any) -> RayModule:
        """The constructor's arguments (nothing is built now: each actor builds its own)."""
        location = caller_location()
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self._check_constructor(location, explicit=True)
        return self

    def ray_options(self, **options: Any) -> RayModule:
        """Execution options and Ray actor options, as upstream RayOrch's builder takes them."""
        location = caller_location()
        self._route(options, location, ".ray_options")
        self.options = self._build(location)
        return self

    def returns(self, count: int) -> RayModule:
        """How many output Ports one Call has; the UDF returns one list per output."""
        location = caller_location()
        self._exec["num_outputs"] = count
        if self._exec["output_layout"] is None:
            self._exec["output_layout"] = "columns"
        self.options = self._build(location)
        return self

    # -- checks ----------------------------------------------------------------------
    def _route(self, options: dict[str, Any], location: Any, where: str) -> None:
        """Sort ``options`` into execution options and Ray actor options; refuse the rest."""
        for key, value in options.items():
            if key == "num_outputs":
                raise _wrong_option(f"num_outputs in {where}", location,
                                    "declare outputs with .returns(n) (or num_outputs=n)")
            if key == "max_retries":
                raise _wrong_option(
                    f"max_retries in {where} is ambiguous", location,
                    "use recovery=ro.RecoveryPolicy.retry_batch(max_retries=n) for exceptions, "
                    "max_attempts=n for crashes")
            if key in ("batch_scope", "batching_policy"):
                raise _wrong_option(f"{key} in {where}", location,
                                    "use policy='elastic' (batches across parents, the default) "
                                    "or policy='parent_bound'")
            if key in RESERVED_RAY_OPTIONS:
                raise _wrong_option(f"Ray option {key!r} in {where}", location,
                                    f"leave it out: {RESERVED_RAY_OPTIONS[key]}")
            if key in _OPTION_NAMES:
                self._exec[key] = value
            elif key in RAY_ACTOR_OPTIONS:
                self._ray[key] = value
            else:
                raise _wrong_option(
                    f"unknown option {key!r} in {where}", location,
                    "execution options: " + ", ".join(sorted(_OPTION_NAMES)) + "; Ray actor "
                    "options: " + ", ".join(sorted(RAY_ACTOR_OPTIONS)) + "; constructor "
                    "arguments go to .pre_init(...)")

    def _check_constructor(self, location: Any, *, explicit: bool) -> None:
        """The constructor arguments must fit the target's signature (checked here, not at
        actor start), and a flat keyword may not be both an option and a parameter."""
        try:
            signature = locked_signature(self.target)
        except (TypeError, ValueError):
            return  # a builtin or extension type: nothing to check against
        params = signature.parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        if not explicit:
            # An execution option set flat that the constructor also takes: say which is meant.
            defaults = self._defaults()
            try:
                positional = signature.bind_partial(*self.args).arguments
            except TypeError:
                positional = {}
            for name in params:
                if name in positional:
                    continue  # the constructor gets it positionally: the keyword is the option
                if name in _OPTION_NAMES and self._exec.get(name) not in (None, defaults.get(name)):
                    raise _wrong_option(
                        f"{name!r} is both an execution option and a parameter of "
                        f"{getattr(self.target, '__name__', 'the target')}", location,
                        f"say which: .pre_init({name}=...) for the constructor, "
                        f".ray_options({name}=...) for the execution option")
        what = getattr(self.target, "__name__", "the target")
        if inspect.isclass(self.target):
            what += ".__init__"
        if not explicit:
            # A Ray option given flat is refused even if **kwargs would swallow it; a
            # constructor that really takes it by that name gets it with .pre_init(...).
            for key in self.kwargs:
                if key not in params and (key in RAY_ACTOR_OPTIONS or key in RESERVED_RAY_OPTIONS):
                    self._refuse_kwarg(key, what, location)
        if not inspect.isclass(self.target):
            # A function: the arguments are bound now, the batch comes first at each call.
            unknown = [k for k in self.kwargs if k not in params and not takes_any]
            if unknown:
                self._refuse_kwarg(unknown[0], what, location)
            return
        try:
            signature.bind_partial(*self.args, **self.kwargs)
        except TypeError as exc:
            unknown = [k for k in self.kwargs if k not in params and not takes_any]
            if unknown:
                self._refuse_kwarg(unknown[0], what, location)
            raise _wrong_option(f"the arguments do not fit {what}{signature}: {exc}",
                                location, "pass the constructor's arguments") from None

    @staticmethod
    def _refuse_kwarg(key: str, what: str, location: Any) -> None:
        if key in RAY_ACTOR_OPTIONS or key in RESERVED_RAY_OPTIONS:
            raise _wrong_option(
                f"{key!r} is a Ray actor option, not a parameter of {what}", location,
                f"pass it as ray_options={{{key!r}: ...}} (or .ray_options({key}=...)); "
                f"if the constructor means it, .pre_init({key}=...)")
        raise _wrong_option(
            f"unknown option {key!r}: neither an execution option nor a parameter of {what}",
            location,
            "execution options: " + ", ".join(sorted(_OPTION_NAMES | {"num_outputs"}))
            + "; Ray actor options go in ray_options={...}; check the spelling")

    @staticmethod
    def _defaults() -> dict[str, Any]:
        return {"replicas": 1, "batch_size": 1, "num_cpus": 1.0, "num_gpus": 0.0,
                "batched": True, "num_outputs": 1, "policy": Policy.ELASTIC, "max_inflight": 1}

    def _build(self, location: Any) -> ModuleOptions:
        e = self._exec
        try:
            recovery = None if e["recovery"] is None else as_policy(e["recovery"])
        except RecoveryError as exc:
            raise _wrong_option(str(exc), location, "use ro.RecoveryPolicy.retry_batch(...), "
                                "retry_tail(...), isolate_tail() or abort()") from None
        max_attempts = e["max_attempts"]
        if max_attempts is None:
            infra = None if recovery is None else recovery.infra_retries
            max_attempts = _DEFAULT_MAX_ATTEMPTS if infra is None else infra + 1
        layout = e["output_layout"]
        if layout is None:
            layout = "columns" if callable(getattr(self.target, "run", None)) else "rows"
        num_cpus, num_gpus = e["num_cpus"], e["num_gpus"]
        replicas, max_replicas = _replica_range(e["replicas"], location)
        max_rss = _max_rss(e.get("max_rss"), location)
        checks = [
            (_is_int(e["batch_size"]) and e["batch_size"] >= 1,
             f"batch_size={e['batch_size']!r}", "batch_size must be >= 1 (an int)"),
            (_is_int(max_attempts) and max_attempts >= 1, f"max_attempts={max_attempts!r}",
             "max_attempts must be >= 1 (an int)"),
            (_is_int(e["num_outputs"]) and e["num_outputs"] >= 1,
             f"num_outputs={e['num_outputs']!r}", "num_outputs must be >= 1 (an int)"),
            (isinstance(num_cpus, (int, float)) and isinstance(num_gpus, (int, float))
             and num_cpus >= 0 and num_gpus >= 0, "negative or non-numeric resources",
             "num_cpus/num_gpus must be numbers >= 0"),
            (e["timeout_s"] is None or e["timeout_s"] > 0, f"timeout_s={e['timeout_s']}",
             "timeout_s must be > 0"),
            (_is_int(e["max_inflight"]) and e["max_inflight"] >= 1,
             f"max_inflight={e['max_inflight']!r}",
             "max_inflight (batches one actor runs at once) must be an int >= 1"),
            (e.get("max_batches") is None
             or (_is_int(e["max_batches"]) and e["max_batches"] >= 1),
             f"max_batches={e.get('max_batches')!r}",
             "max_batches (batches an actor runs before it is recycled) must be an int >= 1"),
            (layout in ("rows", "columns"), f"output_layout={layout!r}",
             "output_layout is 'rows' (a tuple per record) or 'columns' (a list per output)"),
        ]
        for ok, what, fix in checks:
            if not ok:
                raise ce.ModuleDefinitionError(f"invalid option {what}", location, fix)
        try:
            policy = Policy(e["policy"])
        except ValueError:
            raise ce.ModuleDefinitionError(
                f"unknown policy {e['policy']!r}",
                location,
                "use policy='elastic' or policy='parent_bound'",
            ) from None
        return ModuleOptions(
            replicas=replicas,
            max_replicas=max_replicas,
            batch_size=e["batch_size"],
            num_cpus=float(num_cpus),
            num_gpus=float(num_gpus),
            resources=tuple(sorted((e["resources"] or {}).items())),
            max_attempts=max_attempts,
            timeout_s=e["timeout_s"],
            policy=policy,
            batched=e["batched"],
            num_outputs=e["num_outputs"],
            ray_options=tuple(sorted(self._ray.items())),
            recovery=recovery,
            output_layout=layout,
            max_inflight=e["max_inflight"],
            max_rss=max_rss,
            max_batches=e.get("max_batches"),
            keep_values=bool(e.get("keep_values", False)),
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


def _max_rss(value: Any, location: Any) -> int | None:
    """A module's ``max_rss`` in bytes (None: no limit)."""
    if value is None:
        return None
    try:
        return parse_byte_size(value)
    except ValueError as exc:
        raise ce.ModuleDefinitionError(f"invalid option max_rss={str(value)[:40]!r}", location,
                                       f"{exc} (the resident memory past which an actor is "
                                       "recycled)") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def function(fn: Any = None, *, num_outputs: int = 1) -> Any:
    """Upstream RayOrch's ``ro.function``: a function as a stateless RayModule.

    ``ro.function(fn)`` or ``@ro.function(num_outputs=2)``; the function gets the batch
    (one list per input) and returns one list per output.
    """

    def wrap(target: Any) -> RayModule:
        module = RayModule(target, num_outputs=num_outputs, output_layout="columns")
        return module

    return wrap if fn is None else wrap(fn)


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
            # Upstream RayOrch pipelines do not call super().__init__(): start the registry
            # on the first module instead.
            modules = self.__dict__.setdefault("_modules", {})
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

    def compile(self, *, optimize: bool = True) -> Plan:
        """Trace ``forward`` once and check it; the Plan is cached.

        ``optimize`` is accepted for upstream RayOrch programs; rayorch's plan has no
        optimisation pass to turn off.
        """
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


__all__ = ["PipelineBase", "Port", "RayModule", "constructor_args", "function"]
