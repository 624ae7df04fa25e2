"""What every ``rayorch run <job>`` shares: options, output directory, progress, summary,
exit code. A job command builds its pipeline and hands the rest to :func:`run_job`::

    spec = InputSpec(args.input, (".pdf",), "PDF")
    return run_job(args, job=PDF_JOB, spec=spec, pipeline=PdfPipeline(...),
                   options={...}, writer=PDF_WRITER, engine=("--ocr", args.ocr),
                   outputs=lambda out, summary: "...")

which prepares ``--output`` (:class:`OutputDir`: refused, ``--overwrite`` or
``--resume``), prints the start-up lines (:class:`StartupClock`), runs the sources
``--resume`` left delivering to the run's file sink in ``--output`` (the job's
:class:`JobWriter` writes each source's files beside its part file), counts each result
as it is delivered (piped: :class:`ProgressLines`), prints the summary (failed files
named) and returns the exit code.

Rules (docs/topics/JOBS.md, "The job commands"): a non-empty ``--output`` from an
earlier run is refused unless ``--overwrite`` (its outputs are removed first) or
``--resume`` (its finished sources are kept, the rest run again); no stale file
survives any run. Exit 0 only when every source succeeded, 1 when some failed (0 with
``--allow-failures``), 2 for usage errors.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

import orjson

from rayorch.core.errors import RayorchError
from rayorch.core.program import Replicas
from rayorch.core.words import plural
from rayorch.pipelines.inputs import InputChanged, InputSpec, InputStream
from rayorch.pipelines.job.layouts import PDF_JOB, VIDEO_JOB, JobLayout
from rayorch.pipelines.job.output import (
    DOCUMENT_NAME,
    LINES_KEY,
    MARKER,
    JobWriter,
    OutputDir,
    UsageError,
)
from rayorch.pipelines.job.summary import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    JobSummary,
    format_rate,
    format_seconds,
    model_usage,
    per_part,
    run_cost,
    summary_text,
)
from rayorch.pipelines.sources import slug
from rayorch.runtime import ray_cluster
from rayorch.runtime.metrics import add_metrics_options
from rayorch.runtime.ray_cluster import ray_size_for
from rayorch.runtime.session import open_store_checked
from rayorch.store.registry import add_archive_option, is_shared_store, with_archive


def summary_dict(summary: JobSummary, out: OutputDir) -> dict[str, Any]:
    """The ``--json`` form of a finished job: counts, failures, warnings, engines.

    Keys are the job's words: ``documents``/``pages`` for the PDF job, ``videos``/
    ``clips`` for the video job. ``failed_files`` names up to
    :data:`~rayorch.pipelines.job.summary.MAX_KEPT_FAILURES` failed sources, first by name;
    ``failed_files_omitted`` counts the others (the rows file has each one's row).
    """
    unit, part = summary.layout.unit, summary.layout.part
    failures = summary.failures
    return {
        f"{unit}s": summary.done + summary.kept,
        "succeeded": summary.succeeded + summary.kept,
        "failed": summary.failed,
        "dropped": summary.dropped,
        "drops": dict(summary.drops),
        "kept": summary.kept,
        f"{part}s": summary.parts,
        "failures": summary.failure_kinds(),
        "failed_files": [{"source": s, "cause": c} for s, c in failures],
        "failed_files_omitted": summary.failed - len(failures),
        "warnings": list(summary.warnings),
        f"{part}_engines": dict(sorted(summary.engines.items())),
        "out_dir": out.url,
    }


# -- store, Ray start-up and progress ----------------------------------------------------
def start_ray_for(plan: Any, address: str | None) -> str:
    """The job's Ray: attached, or a private local one sized for ``plan``'s pools, as
    ``Pipeline.run``'s (:func:`rayorch.runtime.ray_cluster.start_ray_for`), its workers'
    output not relayed (the job prints its own lines)."""
    return ray_cluster.start_ray_for(plan, address, log_to_driver=False)


def ray_resources() -> dict[str, float]:
    """The CPUs and GPUs of the Ray cluster the job runs on (what a run's cost counts)."""
    import ray

    if not ray.is_initialized():  # (a test's stand-in for start_ray_for)
        return {}
    resources = ray.cluster_resources()  # type: ignore[no-untyped-call]
    return {key: float(resources.get(key, 0.0)) for key in ("CPU", "GPU")}


def require_price(args: argparse.Namespace) -> None:
    """``--cpu-price``/``--gpu-price``: finite dollars per hour >= 0 (a ``UsageError``)."""
    for name in ("cpu_price", "gpu_price"):
        value = getattr(args, name, None)
        if value is not None and not (0.0 <= value < math.inf):
            raise UsageError(f"--{name.replace('_', '-')} is dollars per hour >= 0, not {value}")


def given_options(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """``{name: value}`` of the options among ``names`` that were given (not ``None``): what
    is left out takes the pipeline's own default (pool sizes: ``"auto"``)."""
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def native_limits(args: argparse.Namespace) -> dict[str, Any]:
    """``{"actor_max_rss": ...}`` when ``--actor-max-rss`` was given (checked: a
    ``UsageError`` in one line), else ``{}`` (the pipeline's default)."""
    from rayorch.pipelines.limits import max_rss_bytes

    if args.actor_max_rss is None:
        return {}
    try:
        max_rss_bytes(args.actor_max_rss)
    except RayorchError as exc:
        raise UsageError(f"--actor-max-rss: {exc}") from None
    return {"actor_max_rss": args.actor_max_rss}


def pool_size_text(options: Any) -> str:
    """A pool's size as the job options write it: ``x2`` (fixed), ``x1-8`` (a range) or
    ``auto``."""
    if not options.sizes_itself:
        return f"x{options.replicas}"
    if options.replicas_text == "auto":
        return "auto"
    return f"x{options.replicas}-{options.max_replicas}"


def pools_text(plan: Any) -> str:
    """``render auto, ocr x2, assemble x1``: each pool and its size (the start-up line)."""
    return ", ".join(f"{m.name} {pool_size_text(m.options)}" for m in plan.modules)


def pools_summary(plan: Any, sizer: Any) -> dict[str, Any]:
    """The ``--json`` ``pools`` of a run: per pool its ``replicas`` (``"2"``, ``"1-8"``,
    ``"auto"``) and sizes (``start``, ``most``, ``end``, ``changes``), and ``bound_by``: the
    stage that bound the run (the sizer's; None when no pool sizes itself or no decision
    was made)."""
    pools: dict[str, Any] = {}
    for m in plan.modules:
        sizes = ([size for _, size in sizer.size_over_time(m.name)] if sizer is not None
                 else [m.options.replicas])
        pools[m.name] = {"replicas": pool_size_text(m.options).removeprefix("x"),
                         "start": sizes[0], "most": max(sizes), "end": sizes[-1],
                         "changes": len(sizes) - 1}
    return {"pools": pools, "bound_by": None if sizer is None else sizer.binding()}


class StartupClock:
    """Start-up lines on stderr and the times of each phase (Ray, pools, run)."""

    def __init__(self, *, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.t0 = time.monotonic()
        self.t_ray: float | None = None
        self.t_pools: float | None = None
        self.t_end: float | None = None

    def say(self, line: str) -> None:
        if not self.quiet:
            print(line, file=self.stream, flush=True)

    def starting_ray(self) -> None:
        self.say("rayorch: starting Ray...")

    def starting_pools(self, plan: Any) -> None:
        self.t_ray = time.monotonic()
        self.say(f"rayorch: starting {plural(len(plan.modules), 'pool')} "
                 f"({pools_text(plan)})...")

    def running(self) -> float:
        self.t_pools = time.monotonic()
        return self.t_pools

    def actors_up(self, at: float | None) -> None:
        """The run started while its actors started: its start-up ends when they were up."""
        if at is not None and self.t_pools is not None and at > self.t_pools:
            self.t_pools = at

    def done(self) -> None:
        self.t_end = time.monotonic()

    def times(self) -> dict[str, float]:
        """``ray_start_s``, ``pools_start_s``, ``startup_s``, ``run_s``, ``wall_s``."""
        end = self.t_end or time.monotonic()
        ray_at = self.t_ray or self.t0
        pools_at = self.t_pools or ray_at
        return {"ray_start_s": round(ray_at - self.t0, 3),
                "pools_start_s": round(pools_at - ray_at, 3),
                "startup_s": round(pools_at - self.t0, 3),
                "run_s": round(end - pools_at, 3),
                "wall_s": round(end - self.t0, 3)}


class ProgressLines:
    """One progress line every ``every_s`` seconds on stderr (a background thread), and
    one when the run ends."""

    def __init__(self, summary: JobSummary, *, enabled: bool, every_s: float = 5.0,
                 stream: TextIO | None = None) -> None:
        self.summary = summary
        self.enabled = enabled and every_s > 0
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            print(self.summary.progress_line(), file=self.stream, flush=True)

    def __enter__(self) -> ProgressLines:
        if self.enabled:
            self._thread = threading.Thread(target=self._loop, name="rayorch-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            if exc_type is None:  # the last line says where the run ended (n/n)
                print(self.summary.progress_line(), file=self.stream, flush=True)


# -- the command --------------------------------------------------------------------------
def replicas_type(text: str) -> Replicas:
    """``--replicas``: ``4``, ``1-8`` (the pool sizes itself between them) or ``auto``."""
    from rayorch.core.program import parse_replicas

    try:
        return parse_replicas(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_job_options(parser: argparse.ArgumentParser, job: JobLayout, *, input_help: str
                    ) -> None:
    """The options every ``rayorch run <job>`` takes: input, output, store, output handling,
    exit code, Ray, progress."""
    unit = job.unit
    group = parser.add_argument_group("every job")
    group.add_argument("--input", default=None, help=f"{input_help} (a directory, object "
                       "store prefix or file; listed as the run goes)")
    group.add_argument("--input-list", default=None, metavar="URL",
                       help=f"instead of --input: a manifest of {unit}s, one row each with "
                       "its url (or path) and any other columns (kept under 'metadata' in "
                       f"{job.rows}): JSONL, CSV or Parquet, plain, .gz or .zst, local or on "
                       "an object store, read as a stream")
    group.add_argument("--output", required=True,
                       help=f"directory or object store URL (s3://bucket/prefix) for the "
                       f"outputs ({job.rows} and the rest)")
    group.add_argument("--store", default="memory://",
                       help="lineage store URL (default: memory://)")
    add_archive_option(group)
    group.add_argument("--overwrite", action="store_true",
                       help="replace the outputs of an earlier run in --output")
    group.add_argument("--resume", action="store_true",
                       help=f"continue an earlier run in --output: keep its finished "
                       f"{unit}s, run the rest")
    group.add_argument("--allow-failures", action="store_true",
                       help=f"exit 0 even when some {unit}s failed")
    group.add_argument("--address", default=None,
                       help="Ray cluster to attach to (default: $RAY_ADDRESS, else a "
                       "private local Ray on 127.0.0.1)")
    group.add_argument("--no-progress", action="store_true",
                       help="no live table or progress lines")
    group.add_argument("--progress-every", type=float, default=5.0, metavar="SECONDS",
                       help="seconds between progress lines when stdout is not a "
                       "terminal (default 5)")
    group.add_argument("--json", action="store_true", help="print the summary as JSON")
    group.add_argument("--ui", action="store_true",
                       help="serve the web view of the run on 127.0.0.1 while it lasts")
    group.add_argument("--reuse", default=None, metavar="RUN",
                       help="reuse the Grains of an earlier run in --store whose code, "
                       "arguments and inputs are unchanged (a run id, or 'latest')")
    group.add_argument("--no-reuse", action="append", default=[], metavar="CALL",
                       help="with --reuse: run this Call again anyway (e.g. ocr; repeatable)")
    group.add_argument("--actor-max-rss", default=None, metavar="SIZE",
                       help="recycle an actor of a native-memory stage (render, OCR, layout, "
                       "decode) once its resident memory passes SIZE, e.g. 2GB or 800MiB; "
                       "'off' never (default 3GB; model engines are not recycled)")
    group.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                       dest="storage_options",
                       help="an object store setting for s3://, gs://, az:// --input and "
                       "--output, e.g. endpoint=http://host:9000 (repeatable; credentials "
                       "come from the cloud's standard environment)")
    group.add_argument("--format", default="files", dest="out_format",
                       choices=("files", "parquet", "jsonl.zst", "wds"),
                       help=f"files (default): one file per {unit} and {job.rows}; parquet, "
                       "jsonl.zst or wds: typed shards rolled by --shard-size, with "
                       "_index.parquet (docs/output-formats.md)")
    group.add_argument("--shard-size", default="512MB", metavar="SIZE",
                       help="bytes per shard of a shard --format, e.g. 512MB (default), 64MiB")
    add_metrics_options(group)
    group.add_argument("--cpu-price", type=float, default=None, metavar="USD",
                       help="dollars per CPU core-hour: the summary (and --json) gives the "
                       "run's cost per million " + f"{job.part}s")
    group.add_argument("--gpu-price", type=float, default=None, metavar="USD",
                       help="dollars per GPU-hour (as --cpu-price; with it, pages/s per GPU)")


def add_job_parser(jobs: Any, job: JobLayout, *, help: str, description: str,
                   input_help: str, func: Callable[[argparse.Namespace], int]) -> Any:
    """Register ``rayorch run <job>`` with the options every job takes; returns the
    argument group for the job's own options."""
    parser = jobs.add_parser(job.job, help=help, description=description,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_options(parser, job, input_help=input_help)
    parser.set_defaults(func=func)
    return parser.add_argument_group(f"{job.job} job")


def input_spec(args: argparse.Namespace, suffixes: tuple[str, ...], what: str, *,
               archives: bool = False) -> InputSpec:
    """The job's input: ``--input`` (listed; with ``archives`` a ``.zip``/``.tar``/``.tar.gz``
    there is a container of sources) or ``--input-list`` (a manifest), exactly one (a
    ``UsageError`` otherwise)."""
    given = [name for name in ("input", "input_list") if getattr(args, name, None)]
    if len(given) != 1:
        raise UsageError("give the input: --input DIR|PREFIX or --input-list URL (one of them)")
    if given[0] == "input_list":
        from rayorch.pipelines.input_lists import check_list_url

        try:
            return InputSpec(check_list_url(args.input_list), suffixes, what, manifest=True)
        except RayorchError as exc:
            raise UsageError(str(exc)) from None
    return InputSpec(str(args.input), suffixes, what, archives=archives)


def require_positive(args: argparse.Namespace, *names: str) -> None:
    """A ``UsageError`` naming the first option of ``names`` that is given and not > 0."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, not {value}")


def output_format(args: argparse.Namespace) -> dict[str, Any]:
    """``{"format", "shard_size"}`` of a shard ``--format`` (checked: a ``UsageError``), else
    ``{}``: a ``files`` run's options stay as they were (its ``--resume`` compares them)."""
    from rayorch.core.sizes import parse_byte_size

    fmt = getattr(args, "out_format", "files") or "files"
    if fmt == "files":
        return {}
    try:
        size = parse_byte_size(args.shard_size)
    except ValueError as exc:
        raise UsageError(f"--shard-size: {exc}") from None
    for module in ("pyarrow", *(("zstandard",) if fmt == "jsonl.zst" else ())):
        try:
            __import__(module)
        except ImportError:
            raise UsageError(f"--format {fmt} needs {module}: pip install 'rayorch[shards]'") \
                from None
    return {"format": fmt, "shard_size": size}


def run_job(
    args: argparse.Namespace,
    *,
    job: JobLayout,
    spec: InputSpec,
    pipeline: Any,
    options: dict[str, Any],
    writer: JobWriter,
    engine: tuple[str, str],
    outputs: Callable[[OutputDir, JobSummary], str],
    rebuild: Callable[[OutputDir], Any] | None = None,
) -> int:
    """Run ``pipeline`` over the sources ``spec`` lists into ``args.output`` by the rules
    above.

    ``options`` are the job options a ``--resume`` must find unchanged; ``writer`` writes
    each finished source's files beside its part file and counts it; ``engine`` is
    ``(option, value)`` for the summary (``("--ocr", "auto")``); ``outputs(out, summary)``
    says what the run left in ``--output``. The input is streamed
    (:class:`~rayorch.pipelines.inputs.InputStream`): the first source is dispatched once
    the first listing page is in, the largest first within each read-ahead window; each
    source's id is its listing position.
    ``rebuild(out)``: the pipeline again once ``--output`` is prepared (its dedup index is
    the output's). Documents a data-quality stage dropped are counted apart and listed in
    ``dropped.jsonl`` (``job/drops.py``). Returns the exit code.
    """
    from rayorch.pipelines.job.drops import check_dedup_store, drop_rows, readable_store

    plan = pipeline.compile()
    require_price(args)
    args.store = with_archive(args.store, args.archive)
    options = {**options, **output_format(args)}
    open_store_checked(args.store, retries=1).close()  # before --output is touched or Ray starts
    check_dedup_store(args)
    if (args.reuse or args.no_reuse) and not is_shared_store(args.store):
        raise UsageError("--reuse needs the store of the earlier run: pass --store redis://... "
                         "(a memory:// store ends with its process)")
    if args.no_reuse and not args.reuse:
        raise UsageError("--no-reuse CALL goes with --reuse RUN")
    stream = InputStream(spec)
    try:
        if not stream.prime():
            raise UsageError(f"no {spec.what} files under {spec.url}")
        out = OutputDir.prepare(args.output, job=job, input=spec.record(), options=options,
                                overwrite=args.overwrite, resume=args.resume)
    except BaseException:
        stream.close()
        raise
    stream.kept = out.kept
    out.stream = stream
    if rebuild is not None:
        pipeline = rebuild(out)
        plan = pipeline.compile()
    pending = iter(stream)
    try:  # the first source to run (an input changed under --resume fails here, before Ray)
        first = next(pending, None)
    except InputChanged as exc:
        stream.close()
        out.finish(False)
        raise UsageError(str(exc)) from None
    tty = sys.stdout.isatty()
    clock = StartupClock(quiet=args.no_progress and not tty)
    summary = JobSummary(job, total=stream.listed if stream.done else None,
                         kept=len(out.kept))
    complete = False
    run_id = None
    cluster: dict[str, float] = {}
    pools: dict[str, Any] = {"pools": None, "bound_by": None}
    usage: dict[str, Any] = {}  # model tokens, when a stage counted some
    # With --json stdout carries the summary only: what Ray prints there meanwhile (a
    # raylet warning as the pools grow, say) goes to stderr.
    stdout = sys.stdout
    stages = getattr(pipeline, "quality_stages", None)
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext(), \
            readable_store(args.store) as (store_url, store):
        try:
            if first is not None:
                clock.starting_ray()
                start_ray_for(plan, args.address)
                cluster = ray_resources()
                clock.starting_pools(plan)
                progress = False if args.no_progress or not tty else None
                # Each source keeps its listing position as its lineage index (the ids of
                # its outputs), whatever order it is dispatched in: `rayorch show RUN N` is
                # id N.
                from rayorch.driver import new_run_id

                sink = out.sink_for(new_run_id(plan), writer)
                handle = pipeline.run(store=store_url, ordered=False,
                                      progress=progress, address=args.address,
                                      indexed=itertools.chain([first], pending),
                                      sink=sink, reuse=args.reuse,
                                      no_reuse=args.no_reuse, ui=args.ui,
                                      metrics_port=args.metrics_port,
                                      metrics_host=args.metrics_host)
                run_id = handle.run_id
                out.note_run(run_id)
                summary.run_started = clock.running()
                summary.actors_up = lambda: handle.actors_up_at
                lines = ProgressLines(summary, enabled=not tty and not args.no_progress,
                                      every_s=args.progress_every)
                with lines:
                    for index, value in handle:  # delivered: its part file and fact are written
                        writer.delivered(summary, stream.name(index), value)
                        if not writer.finished(value):  # its name and columns, for its row
                            out.keep_failed(index)
                        stream.release(index)
                        if stream.done:
                            summary.total = stream.listed
                    clock.actors_up(handle.actors_up_at)
                    clock.done()
                    summary.run_ended = clock.t_end
                pools = pools_summary(plan, handle.pool_sizer)
                usage = model_usage(handle.stats)
                if stages:  # why each dropped document was dropped, from the run's facts
                    out.drops = drop_rows(store, run_id, out.source_name, out.ids_of)
                    summary.drops = dict(Counter(f"{d['stage']}: {d['reason']}"
                                                 for d in out.drops).most_common())
            else:
                summary.run_started = clock.running()
            complete = True
        finally:
            stream.close()
            if clock.t_end is None:
                clock.done()
            out.finish(complete)
    if stream.done:
        summary.total = stream.listed
    result = {**summary_dict(summary, out), **clock.times(), "run_id": run_id,
              "engine": engine[1], "engine_option": engine[0], **pools}
    summary.run_ended = clock.t_end
    rate = summary.rate() if run_id is not None else None
    # as format_rate shows it: one decimal, three digits under 10/s (OCR on a CPU)
    result[f"{job.part}s_per_s"] = None if rate is None else float(format_rate(rate))
    result |= per_part(usage, result[f"{job.part}s"], job.part)
    result |= run_cost(result, job.part, cpus=cluster.get("CPU", 0.0),
                       gpus=cluster.get("GPU", 0.0), cpu_price=args.cpu_price,
                       gpu_price=args.gpu_price)
    if args.json:
        stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(summary_text(result, summary, outputs(out, summary)))
    return summary.exit_code(allow_failures=args.allow_failures)


__all__ = [
    "DOCUMENT_NAME", "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "LINES_KEY", "MARKER", "PDF_JOB",
    "VIDEO_JOB", "JobLayout", "JobSummary", "JobWriter", "OutputDir", "ProgressLines",
    "StartupClock", "UsageError", "add_job_options", "add_job_parser",
    "format_seconds", "given_options", "input_spec", "plural", "pool_size_text",
    "pools_summary", "pools_text", "ray_size_for", "replicas_type", "require_positive",
    "run_job", "slug", "start_ray_for", "summary_dict", "summary_text",
]
