"""A committed fact's outline: the structure a fold of a delivered source needs once its
payload is freed (docs/topics/PAYLOADS.md, "Freeing values")."""

from __future__ import annotations

from collections import namedtuple

from rayorch.core.facts import (
    CODEC_VERSION,
    FREED,
    REPORT_PRESENT,
    GrainCommitted,
    outline_of,
    pack_value,
    unpack_value,
)
from rayorch.store.records import decode_fact, encode_fact


def test_an_outline_keeps_lengths_masks_and_small_values_only() -> None:
    pages = [{"png": b"x" * 5000, "page": i} for i in range(3)]
    outline = outline_of((pages, [True, False, True], 7, "a long text " * 20, (1, 2)))
    assert outline == ([FREED, FREED, FREED], [True, False, True], 7, FREED, (1, 2))
    assert type(outline[0]) is list and len(pack_value(outline)) < 40
    point = namedtuple("point", "x y")(1, b"y" * 100)
    assert outline_of((point,)) == ((1, FREED),)  # stored as a plain tuple


def test_freed_values_and_outlines_survive_the_codec() -> None:
    assert unpack_value(pack_value([FREED, (FREED, 1)])) == [FREED, (FREED, 1)]
    fact = GrainCommitted("render", (0,), 0, REPORT_PRESENT, None, payload_ref="r/render/x.seg@0+9",
                          outline=([FREED, FREED], ["p1", "p2"]))
    assert decode_fact(encode_fact(fact)) == fact
    # a fact of an older run: no outline field at all
    older = pack_value([CODEC_VERSION, "grain_committed", 0.0, "render", [0], 0, REPORT_PRESENT,
                        None, None, "r/render/0.g0.d.msgpack"])
    assert decode_fact(older) == GrainCommitted("render", (0,), 0, REPORT_PRESENT,
                                                payload_ref="r/render/0.g0.d.msgpack")
