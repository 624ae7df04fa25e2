"""The ``rayorch`` command: data-preparation jobs on Ray, and the runs their lineage keeps.

It runs the shipped jobs and inspects, audits, resumes and serves the runs of a lineage store.

    rayorch run pdf --input DIR|URL --output DIR|URL   PDFs -> Markdown, content lists, figures
    rayorch run video --input DIR --output DIR        videos -> scene clips -> annotations
    rayorch runs  --store URL                 list the runs
    rayorch audit RUN --store URL [--json]    verify a run's lineage and delivery evidence
    rayorch show  RUN ENTITY --store URL      the lineage tree of one source item
    rayorch timeline RUN --store URL -o run.png   per-Call windows and throughput
    rayorch driver RUN --store URL [--out-dir D --format FMT]   join a run
    rayorch resume RUN --store URL [--out-dir D --format FMT]   continue a run
    (FMT: jsonl, parquet, jsonl.zst, wds; docs/output-formats.md)
    rayorch status RUN --store URL [--json]   parents done / in progress, drivers, leases
    rayorch delete RUN --store URL            remove a run's keys and payload files
    rayorch archive RUN --store URL --archive URL   move a run's facts to an archive
    rayorch gc --store URL [--older-than 7d] [--dry-run]   orphaned payloads, old runs
    rayorch ui --store URL [--host H --port P]   a web view of the runs (live, lineage)

Each subcommand is one ``add_<name>_parser`` function that registers its parser
and one ``cmd_<name>`` function that runs it; add new ones to ``SUBCOMMANDS``.
The store URL defaults to ``$RAYORCH_STORE``.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from rayorch.core.errors import RayorchError
from rayorch.core.ids import format_path, parse_path
from rayorch.core.run_view import fold_shard
from rayorch.core.sanitize import json_safe, sanitize
from rayorch.core.words import format_age, plural
from rayorch.inspect.audit import audit_with_delivery, entity_story
from rayorch.inspect.show import lineage, lineage_lines
from rayorch.runtime.metrics import add_metrics_options
from rayorch.runtime.sinks import FORMATS
from rayorch.storage import parse_storage_options, set_storage_options
from rayorch.store import open_store
from rayorch.store.base import LineageStore
from rayorch.store.records.facts import fact_as_dict
from rayorch.store.registry import add_archive_option, with_archive

EXIT_OK, EXIT_INVARIANT, EXIT_ERROR = 0, 1, 2
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what a shell command says when its reader went away."""


def _print_json(data: Any) -> None:
    text = orjson.dumps(data, option=orjson.OPT_INDENT_2, default=repr).decode()
    sys.stdout.write(json_safe(text) + "\n")


def _say(*lines: str) -> None:
    """Print lines that carry text from the store: ANSI stripped, control characters escaped."""
    for line in lines:
        print(sanitize(line))


def _store(args: argparse.Namespace) -> LineageStore:
    url = args.store or os.environ.get("RAYORCH_STORE")
    if not url:
        raise RayorchError("no lineage store given: pass --store URL or set RAYORCH_STORE")
    return open_store(url)


def _add_store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", help="lineage store URL (default: $RAYORCH_STORE)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_storage_option(parser)


def add_storage_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--storage-option KEY=VALUE``: object store settings beyond the cloud's own
    configuration (kept in memory: never printed, never recorded with the run)."""
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        dest="storage_options",
                        help="an object store setting for s3://, gs://, az:// paths, e.g. "
                        "endpoint=http://host:9000 or region=eu-west-1 (repeatable; "
                        "credentials come from the cloud's standard environment)")


# -- runs ---------------------------------------------------------------------------
def add_runs_parser(sub: Any) -> None:
    parser = sub.add_parser("runs", help="list the runs of a lineage store")
    _add_store_options(parser)
    parser.set_defaults(func=cmd_runs)


def cmd_runs(args: argparse.Namespace) -> int:
    from rayorch.inspect.status import run_summary

    store = _store(args)
    now = time.time()
    summaries = [run_summary(store, info.run_id) for info in store.list_runs()]
    if args.json:
        _print_json([s.as_dict(now) for s in summaries])
        return EXIT_OK
    if not summaries:
        _say("no runs in this store")
        return EXIT_OK
    rows = [("RUN", "CREATED", "AGE", "STATUS", "SOURCES", "FAILURES", "PLAN")]
    for s in summaries:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.created_ts))
        total = "?" if s.total is None else str(s.total)
        rows.append((s.run_id, created, format_age(now - s.created_ts), s.state,
                     f"{s.done}/{total}", str(s.failures), s.plan))
    clean = [[sanitize(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in clean) for i in range(len(rows[0]))]
    for row in clean:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return EXIT_OK


# -- delete / gc (retention) ----------------------------------------------------------
def add_delete_parser(sub: Any) -> None:
    parser = sub.add_parser("delete", help="remove a run: its keys and its payload files")
    parser.add_argument("run", help="run id")
    _add_store_options(parser)
    parser.add_argument("--force", action="store_true",
                        help="delete even while a driver of the run is alive")
    parser.set_defaults(func=cmd_delete)


def cmd_delete(args: argparse.Namespace) -> int:
    from rayorch.store.retention import delete_run, is_running

    store = _store(args)
    store.run_info(args.run)  # a clear error for a run that does not exist
    if not args.force and is_running(store, args.run):
        raise RayorchError(f"run {args.run!r} has a live driver or a held lease; stop its "
                           "drivers first, or pass --force")
    delete_run(store, args.run)
    if args.json:
        _print_json({"deleted": args.run})
    else:
        _say(f"run {args.run}: deleted (keys and payload files)")
    return EXIT_OK


def add_gc_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "gc", help="remove orphaned payload files, and runs older than --older-than",
        description="Remove payload files that no fact refers to (older than an hour), and, "
        "with --older-than, every run created longer ago that no driver is running.")
    _add_store_options(parser)
    parser.add_argument("--older-than", metavar="AGE",
                        help="also delete runs created more than AGE ago (e.g. 7d, 12h, 30m)")
    parser.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    parser.set_defaults(func=cmd_gc)


def cmd_gc(args: argparse.Namespace) -> int:
    from rayorch.store.retention import apply_gc, parse_duration, plan_gc

    older = None if args.older_than is None else parse_duration(args.older_than)
    store = _store(args)
    plan = plan_gc(store, older_than_s=older)
    if not args.dry_run:
        apply_gc(store, plan)
    if args.json:
        _print_json({"dry_run": args.dry_run, **plan.as_dict()})
        return EXIT_OK
    verb = "would delete" if args.dry_run else "deleted"
    lines = [f"gc: {verb} {plural(len(plan.runs), 'run')} and "
             f"{plural(len(plan.orphans), 'orphaned payload file')}"]
    lines += [f"  run {r}" for r in plan.runs]
    lines += [f"  payload {ref}" for ref in plan.orphans]
    lines += [f"  kept run {r}: a driver is running it" for r in plan.kept_running]
    lines += [f"  left payload directory {d}: no run of this store has that id"
              for d in plan.unknown_dirs]
    _say(*lines)
    return EXIT_OK


# -- audit --------------------------------------------------------------------------
def add_audit_parser(sub: Any) -> None:
    parser = sub.add_parser("audit", help="verify the lineage invariants of a run and the "
                            "delivery evidence of its outputs")
    parser.add_argument("run", help="run id")
    _add_store_options(parser)
    parser.add_argument("--out-dir", help="the run's output directory (default: the one the "
                        "run recorded at creation)")
    parser.set_defaults(func=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    report = audit_with_delivery(_store(args), args.run, args.out_dir)
    problems, ok = report.delivery, report.ok
    if args.json:
        _print_json(report.as_dict())
    else:
        failures = len(report.violations) + len(problems)
        verdict = "OK" if ok else f"FAILED ({plural(failures, 'violation')})"
        _say(f"run {report.run_id}: {verdict} - {plural(report.facts, 'fact')} in "
             f"{plural(report.shards, 'shard')}")
        for group, counter in report.counts.items():
            if group == "facts":
                continue
            parts = ", ".join(f"{key} {n}" for key, n in sorted(counter.items()))
            _say(f"  {group}: {parts}")
        _say(*(f"  facts of {place}" for place in report.places))
        _say(*(f"  note: {note}" for note in report.notes))
        _say(*(f"  VIOLATION {violation}" for violation in report.violations))
        _say(*(f"  VIOLATION delivery: {problem}" for problem in problems))
    return EXIT_OK if ok else EXIT_INVARIANT


# -- show ---------------------------------------------------------------------------
def add_show_parser(sub: Any) -> None:
    parser = sub.add_parser("show", help="print the lineage tree of one source item")
    parser.add_argument("run", help="run id")
    parser.add_argument("entity", help="source index or entity path, e.g. 12 or 12.3")
    _add_store_options(parser)
    parser.set_defaults(func=cmd_show)


def cmd_show(args: argparse.Namespace) -> int:
    path = parse_path(args.entity)
    store = _store(args)
    stored = entity_story(store, args.run, path)
    if args.json:
        _print_json([{"seq": s.seq, "domain": s.domain, **fact_as_dict(s.fact)} for s in stored])
        return EXIT_OK
    if not stored:
        _say(f"run {args.run}: no facts about entity {format_path(path)}")
        return EXIT_INVARIANT
    view = fold_shard(path[0], ((s.seq, s.fact) for s in stored))
    _say(*lineage_lines(lineage(view, path)))
    return EXIT_OK


def add_run_parser(sub: Any) -> None:
    """``rayorch run pdf ...`` (defined with the shipped pipelines)."""
    from rayorch.pipelines.job.run_command import add_run_parser as add

    add(sub)


# -- timeline -----------------------------------------------------------------------
def add_timeline_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "timeline", help="draw a run's per-Call windows, throughput, failovers and retries",
        description="Draw a run's timeline from its stored facts: per Call its active window "
        "and throughput (grains committed per second), failovers and physical retries.",
    )
    parser.add_argument("run", help="run id")
    _add_store_options(parser)
    parser.add_argument("-o", "--output", help="PNG file to write (e.g. run.png)")
    parser.add_argument("--bin", type=float, default=None, metavar="SECONDS",
                        help="throughput bin width (default: about 60 bins over the run)")
    parser.add_argument("--dpi", type=int, default=120, help="picture resolution (default 120)")
    parser.set_defaults(func=cmd_timeline)


def cmd_timeline(args: argparse.Namespace) -> int:
    from rayorch.inspect.timeline import draw_timeline, format_seconds, load_timeline

    if not args.output and not args.json:
        raise RayorchError("nothing to do: pass -o FILE.png for the picture, --json for the "
                           "computed numbers, or both")
    if args.bin is not None and args.bin <= 0:
        raise RayorchError(f"--bin must be a positive number of seconds, not {args.bin}")
    timeline = load_timeline(_store(args), args.run, bin_s=args.bin)
    if args.output:
        draw_timeline(timeline, args.output, dpi=args.dpi)
    if args.json:
        _print_json(timeline.as_dict())
    else:
        fan_out = "".join(f", {plural(n, 'child', 'children')} in {domain}"
                          for domain, n in sorted(timeline.children.items()))
        _say(f"run {timeline.run_id}: {plural(len(timeline.windows), 'Call')}, "
             f"{plural(timeline.committed, 'grain')} committed in "
             f"{format_seconds(timeline.elapsed)}{fan_out}; wrote {args.output}")
    return EXIT_OK


# -- driver / resume / status (driver replicas) ----------------------------------------
def add_driver_parser(sub: Any) -> None:
    parser = sub.add_parser("driver", help="join a run as one more driver replica")
    _add_replica_options(parser)
    parser.set_defaults(func=cmd_driver)


def add_resume_parser(sub: Any) -> None:
    parser = sub.add_parser("resume", help="continue a run whose drivers all died")
    _add_replica_options(parser)
    parser.set_defaults(func=cmd_driver)


def _add_replica_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run id (made by create_run, or a Pipeline.run on Redis)")
    parser.add_argument("--store", help="lineage store URL (default: $RAYORCH_STORE)")
    parser.add_argument("--address", help="Ray cluster to join (default: start a local one)")
    parser.add_argument("--driver-id", help="this driver's name (default: host-pid-random)")
    parser.add_argument("--lease-ttl", type=float, default=None,
                        help="shard lease TTL in seconds (default 10)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--trust", action="append", metavar="MODULE",
                        help="only import the run's pipeline from this module or package "
                        "(repeatable; adds to $RAYORCH_TRUSTED_MODULES)")
    parser.add_argument("--out-dir", help="where this driver writes the outputs (part files "
                        "of --format, read with rayorch.runtime.sinks.read_outputs) "
                        "when the run records no output directory, as for a run started by "
                        "Pipeline.run")
    parser.add_argument("--format", choices=FORMATS, default=None, dest="out_format",
                        help="format of the part files in --out-dir (default: the run's, "
                        "else jsonl)")
    add_archive_option(parser)
    add_storage_option(parser)
    add_metrics_options(parser)


def cmd_driver(args: argparse.Namespace) -> int:
    from rayorch.replicas import join_run

    url = args.store or os.environ.get("RAYORCH_STORE")
    if not url:
        raise RayorchError("no lineage store given: pass --store URL or set RAYORCH_STORE")
    url = with_archive(url, args.archive)
    handle = join_run(args.run, store=url, address=args.address, driver_id=args.driver_id,
                      lease_ttl_s=args.lease_ttl, quiet=args.quiet, out_dir=args.out_dir,
                      out_format=args.out_format, require_sink=True, trust=args.trust,
                      metrics_port=args.metrics_port, metrics_host=args.metrics_host)
    with handle:
        handle.wait()
    print(sanitize(handle.stats.summary(), newlines=True), file=sys.stderr)
    _say(f"run {args.run}: complete")
    return EXIT_OK


# -- archive ------------------------------------------------------------------------
def add_archive_parser(sub: Any) -> None:
    parser = sub.add_parser("archive", help="move a run's facts to an archive (a run that "
                            "predates --archive, or one whose archiving was cut short)")
    parser.add_argument("run", help="run id")
    _add_store_options(parser)
    add_archive_option(parser)
    parser.set_defaults(func=cmd_archive)


def cmd_archive(args: argparse.Namespace) -> int:
    from rayorch.store.redis_archive import RedisArchiving

    store = _store(args)
    store.run_info(args.run)  # a clear error for a run that does not exist
    if not isinstance(store, RedisArchiving):
        raise RayorchError("only a Redis store keeps facts to archive (--store redis://...)")
    if args.archive:
        kept = store.set_archive(args.run, args.archive)
        if kept != args.archive:
            raise RayorchError(f"run {args.run!r} already archives to {kept}; pass that URL")
    moved = store.archive_run(args.run)
    places = [place.describe() for place in store.fact_places(args.run)]
    if args.json:
        _print_json({"run": args.run, "moved": moved, "places": places})
    else:
        _say(f"run {args.run}: {plural(sum(moved.values()), 'fact')} archived", *places)
    return EXIT_OK


def add_status_parser(sub: Any) -> None:
    parser = sub.add_parser("status", help="progress of a run: parents, Calls, drivers, leases")
    parser.add_argument("run", help="run id")
    _add_store_options(parser)
    parser.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    from rayorch.inspect.status import run_status

    status = run_status(_store(args), args.run)
    if args.json:
        _print_json(status.as_dict())
    else:
        _say(*status.lines())
    return EXIT_OK


def add_ui_parser(sub: Any) -> None:
    """``rayorch ui`` (the web view, ``rayorch/ui/command.py``)."""
    from rayorch.ui.command import add_ui_parser as add

    add(sub)


SUBCOMMANDS: list[Callable[[Any], None]] = [
    add_run_parser, add_runs_parser, add_audit_parser, add_show_parser,
    add_timeline_parser, add_driver_parser, add_resume_parser, add_status_parser,
    add_delete_parser, add_gc_parser, add_ui_parser, add_archive_parser,
]


class CliParser(argparse.ArgumentParser):
    """argparse whose sub-commands report their own mistakes, naming the closest option.

    A sub-command (a parser without sub-commands of its own) checks its options before
    argparse does: ``--ouput`` is "unrecognized option --ouput: did you mean --output?"
    (not "--output is required"), and an unknown argument is reported with that
    sub-command's usage, not the top-level one. Every sub-parser is of this class.
    """

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._subparsers is not None or args is None:
            return super().parse_known_args(args, namespace)
        self._check_options(list(args))
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def _check_options(self, args: list[str]) -> None:
        known = [name for action in self._actions for name in action.option_strings]
        for arg in args:
            if arg == "--":
                return
            name = arg.split("=", 1)[0]
            if not name.startswith("--") or name in known or (
                    self.allow_abbrev and any(k.startswith(name) for k in known)):
                continue
            # Compared without their dashes, which every long option shares.
            bare = {k.lstrip("-"): k for k in known if k.startswith("--")}
            close = difflib.get_close_matches(name.lstrip("-"), bare, n=1, cutoff=0.7)
            self.error(f"unrecognized option {name}"
                       + (f": did you mean {bare[close[0]]}?" if close else ""))


def build_parser() -> argparse.ArgumentParser:
    from rayorch import __version__

    parser = CliParser(prog="rayorch", description=__doc__.splitlines()[0].replace("``", ""))
    parser.add_argument("--version", action="version", version=f"rayorch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rayorch`` console script; returns the exit code.

    A reader that stops early (``rayorch show ... | head -1``) ends the command quietly.
    """
    try:
        args = build_parser().parse_args(argv)
        try:
            if getattr(args, "storage_options", None):
                set_storage_options(parse_storage_options(args.storage_options))
            code: int = args.func(args)
        except (RayorchError, ValueError) as exc:
            print(sanitize(f"rayorch {args.command}: {exc}", newlines=True), file=sys.stderr)
            return EXIT_ERROR
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that says nothing.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


if __name__ == "__main__":
    sys.exit(main())
