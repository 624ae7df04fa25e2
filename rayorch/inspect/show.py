"""One source item's lineage as data: what ``rayorch show`` prints and the web view draws.

:func:`lineage` reads a shard's view (only the Grains and Expansions of that source, through
the view's per-source index) and returns a :class:`Lineage`: the source's admissions and
outputs, and a tree of :class:`EntityStory` (the source, its pages, their regions...), each
with its Grains' attempts, generations, durations, outcome, cause and reuse origin.
:func:`lineage_lines` is the text of ``rayorch show``.

Example::

    view = store.read_view(run_id).shards[info.shard_of(12)]
    story = lineage(view, (12,))
    [g.outcome for g in story.root.grains]      # e.g. ["present", "present"]
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rayorch.core.facts import GrainRetried, GrainReused, OutputEmitted, SourceAdmitted
from rayorch.core.ids import CallId, DomainId, Path, format_grain, format_path
from rayorch.core.run_view import GrainView, ShardView
from rayorch.core.vocabulary import EXPANSION_SUCCEEDED, REPORT_PRESENT
from rayorch.core.words import plural
from rayorch.inspect.drops import Drop, VerdictReader, grains_drop

# A Grain's state, as shown: its seal, or why it has none.
PRESENT, REUSED, FAILED, IN_FLIGHT, SUPPRESSED, NOT_RUN = (
    "present", "reused", "failed", "in flight", "suppressed", "not run")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One dispatch of a Grain and how it ended: ``committed``, ``lost`` (a physical
    failure, retried), ``failed`` (the last physical failure), ``barred`` (a sibling's
    GroupFailure barrier refuses its report) or ``open``."""

    generation: int
    sent_ts: float
    end: str
    end_ts: float | None = None
    cause: str | None = None

    @property
    def duration_s(self) -> float | None:
        if self.end_ts is None or self.sent_ts <= 0 or self.end_ts <= 0:
            return None
        return max(self.end_ts - self.sent_ts, 0.0)


@dataclass(frozen=True, slots=True)
class GrainStory:
    """One Grain of the tree: its attempts and its end."""

    call: CallId
    path: Path
    state: str  # PRESENT, "record_failure", "group_failure", REUSED, FAILED, IN_FLIGHT, ...
    attempts: tuple[Attempt, ...]
    cause: str | None
    reuse: GrainReused | None
    text: str  # the line ``rayorch show`` prints

    @property
    def name(self) -> str:
        return format_grain((self.call, self.path))

    @property
    def failed(self) -> bool:
        return self.state not in (PRESENT, REUSED, IN_FLIGHT, NOT_RUN)


@dataclass(frozen=True, slots=True)
class ExpansionStory:
    """An Expansion of the entity: its outcome, children, and the children no Grain ran for."""

    domain: DomainId
    outcome: str
    count: int
    quiet: tuple[int, ...]


@dataclass
class EntityStory:
    """One entity of the tree with its Grains, Expansions and children (ordinal order)."""

    path: Path
    grains: list[GrainStory] = field(default_factory=list)
    expansions: list[ExpansionStory] = field(default_factory=list)
    children: list[EntityStory] = field(default_factory=list)

    @property
    def name(self) -> str:
        return format_path(self.path)

    @property
    def failed(self) -> bool:
        """A Grain of it or of a descendant was sealed by a failure (or suppressed)."""
        return any(g.failed for g in self.grains) or any(c.failed for c in self.children)

    def find(self, path: Path) -> EntityStory | None:
        """The entity at ``path`` in this subtree (None: not in it)."""
        node: EntityStory | None = self
        while node is not None and node.path != path:
            if path[:len(node.path)] != node.path:
                return None
            node = next((c for c in node.children if path[:len(c.path)] == c.path), None)
        return node


@dataclass
class Lineage:
    """A source item's (or a descendant's) story: admissions, tree, outputs delivered."""

    path: Path
    admitted: list[SourceAdmitted]
    root: EntityStory
    emitted: list[OutputEmitted]
    drop: Drop | None = None
    """Why a data-quality stage dropped the source (inspect/drops.py), if one did."""

    @property
    def empty(self) -> bool:
        return not (self.admitted or self.emitted or self.root.grains or self.root.children
                    or self.root.expansions)


def _attempts(grain: GrainView) -> tuple[Attempt, ...]:
    out = []
    for _, sent in grain.dispatched:
        gen = sent.generation
        commit = next((c for _, c in grain.committed if c.generation == gen), None)
        lost = next((r for _, r in grain.retried if r.generation == gen + 1), None)
        dead = next((f for _, f in grain.failed if f.generation == gen), None)
        if commit is not None:
            out.append(Attempt(gen, sent.ts, "committed", commit.ts, commit.cause))
        elif dead is not None:
            out.append(Attempt(gen, sent.ts, "failed", dead.ts, dead.cause))
        elif lost is not None:
            out.append(Attempt(gen, sent.ts, "lost", lost.ts, lost.cause))
        else:
            out.append(Attempt(gen, sent.ts, "open"))
    return tuple(out)


def _retry_terms(retry: GrainRetried) -> str:
    """How a crash retry runs (core/crash_split.py); nothing for a plain retry."""
    if not retry.alone:
        return ""
    charge = "" if retry.charged else ", not charged"
    return f" (on an actor of its own, in a batch of at most {retry.limit}{charge})"


def grain_story(grain: GrainView, barrier_cause: str | None) -> GrainStory:
    """A Grain's attempts and end; ``barrier_cause``: a GroupFailure barrier over it."""
    steps = sorted([(seq, f"dispatched as attempt {d.generation}") for seq, d in grain.dispatched]
                   + [(seq, f"attempt {r.generation - 1} lost ({r.cause}), back to ready"
                      + _retry_terms(r)) for seq, r in grain.retried])
    ends = sorted([(seq, f"FAILED after {f.generation + 1} attempts: {f.cause}", FAILED,
                    f.cause) for seq, f in grain.failed]
                  + [(seq, f"committed attempt {c.generation}: present"
                      if c.outcome == REPORT_PRESENT else
                      f"committed attempt {c.generation}: {c.outcome.replace('_', ' ')} "
                      f"({c.cause})", c.outcome, c.cause) for seq, c in grain.committed]
                  + [(seq, f"reused from run {u.origin_run} "
                      f"({format_grain((u.origin_call, u.origin_path))})", REUSED, None)
                     for seq, u in grain.reused], key=lambda e: e[0])
    if ends:
        _, end, state, cause = ends[-1]
    elif barrier_cause is not None:
        end, state, cause = (f"suppressed by a GroupFailure of a sibling ({barrier_cause})",
                             SUPPRESSED, barrier_cause)
    else:
        state = IN_FLIGHT if steps else NOT_RUN
        end, cause = ("in flight" if steps else "not run (decided by its inputs)"), None
    text = f"{format_grain(grain.key)}: " + "; ".join([*(t for _, t in steps), end])
    attempts = _attempts(grain)
    if state == SUPPRESSED:  # its report meets the barrier: the attempt never commits
        attempts = tuple(Attempt(a.generation, a.sent_ts, "barred", None, barrier_cause)
                         if a.end == "open" else a for a in attempts)
    return GrainStory(grain.call, grain.path, state, attempts, cause, grain.reuse, text)


def lineage(view: ShardView, path: Path, verdicts: VerdictReader | None = None) -> Lineage:
    """The lineage of the entity at ``path`` (a source ``(i,)`` or a descendant);
    ``verdicts`` reads a drop's verdict that left its fact (a view read without payloads)."""
    n = len(path)
    index = path[0]
    grains = [view.grains[k] for k in view.by_source.get(index, ()) if k[1][:n] == path]
    children: dict[Path, set[Path]] = {}
    for grain in grains:
        own = grain.path
        for depth in range(n, len(own)):
            children.setdefault(own[:depth], set()).add(own[: depth + 1])
    closes_of: dict[Path, list[tuple[int, DomainId, str, int]]] = {}
    for key in view.expansions_of.get(index, ()):
        if key[1][:n] == path:
            closes_of.setdefault(key[1], []).extend(
                (seq, c.domain, c.outcome, c.count) for seq, c in view.expansions[key])
    barriers = {(b.call, b.parent): b.cause for _, b in view.barriers
                if b.parent[:1] == (index,)}
    grains_at: dict[Path, list[GrainView]] = {}
    for grain in grains:
        grains_at.setdefault(grain.path, []).append(grain)

    def entity(p: Path) -> EntityStory:
        node = EntityStory(p, [grain_story(g, barriers.get((g.call, g.path[:-1])))
                               for g in grains_at.get(p, ())])
        below = children.get(p, set())
        for _, domain, outcome, count in sorted(closes_of.get(p, [])):
            quiet = tuple(i for i in range(count) if (*p, i) not in below) \
                if outcome == EXPANSION_SUCCEEDED else ()
            node.expansions.append(ExpansionStory(domain, outcome, count, quiet))
        node.children = [entity(child) for child in sorted(below)]
        return node

    root_index = index if n == 1 else None
    admitted = [f for _, f in view.admitted.get(index, [])] if root_index is not None else []
    emitted = [f for _, f in view.emitted.get(index, [])] if root_index is not None else []
    drop = grains_drop(index, [g for g in grains if len(g.path) == 1], verdicts) \
        if n == 1 else None
    return Lineage(path, admitted, entity(path), emitted, drop)


def ordinal_ranges(parent: Path, ordinals: tuple[int, ...] | list[int]) -> str:
    """``3.0-3.17, 3.19``: the entities of ``parent`` with these ordinals (ascending)."""
    runs: list[list[int]] = []
    for i in ordinals:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    name = format_path(parent)
    return ", ".join(f"{name}.{a}" if a == b else f"{name}.{a}-{name}.{b}" for a, b in runs)


def lineage_lines(story: Lineage) -> list[str]:
    """The text of ``rayorch show``: one line per admission, Grain, Expansion and output."""
    lines: list[str] = []

    def entity(node: EntityStory, indent: str) -> None:
        lines.extend(f"{indent}  {g.text}" for g in node.grains)
        for exp in node.expansions:
            detail = f", {plural(exp.count, 'child', 'children')}" \
                if exp.outcome == EXPANSION_SUCCEEDED else ""
            lines.append(f"{indent}  expansion {exp.domain}: {exp.outcome}{detail}")
            if exp.quiet:
                lines.append(f"{indent}    {plural(len(exp.quiet), 'child', 'children')} "
                             f"({ordinal_ranges(node.path, exp.quiet)}): no Grain ran, their "
                             "Items were decided by their inputs (e.g. Dropped by F.filter)")
        for child in node.children:
            lines.append(f"{indent}  entity {child.name} (ordinal {child.path[-1]})")
            entity(child, indent + "  ")

    for fact in story.admitted:
        key = f" key {fact.key!r}," if fact.key else ""
        lines.append(f"source {fact.index}:{key} admitted with {list(fact.values)!r}")
    if len(story.path) > 1:
        lines.append(f"entity {format_path(story.path)}")
    entity(story.root, "")
    lines.extend(f"output of source {e.index}: {e.outcome}" for e in story.emitted)
    if story.drop is not None:
        lines.append(story.drop.text())
    return lines


__all__ = ["Attempt", "EntityStory", "ExpansionStory", "GrainStory", "Lineage",
           "grain_story", "lineage", "lineage_lines", "ordinal_ranges"]
