"""What a page child costs the kernel: the PDF job's wiring with and without page children.

    python bench/page_children.py          # -> one JSON line

The PDF job expands every page (``F.expand_aligned(pages, to_ocr)``) and drops the text
pages before the OCR Call (``F.filter``), so the kernel publishes a child and decides its
OCR Item per page without a dispatch. This runs that wiring in process (``runtime.in_process``,
no Ray, sleep-free modules) over 142 documents of 14 pages, once with every page a child
and once with none, and reports the kernel's CPU per child (best of ``--repeat``).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import rayorch as ro
from rayorch import F
from rayorch.runtime.in_process import execute


class Render:
    def __init__(self, pages: int, children: bool) -> None:
        self.pages, self.children = pages, children

    def __call__(self, docs: list[str]) -> list[Any]:
        out = []
        for doc in docs:
            pages = [{"page": i + 1, "engine": "text"} for i in range(self.pages)] \
                if self.children else []
            out.append((pages, [False] * len(pages), {"path": doc, "pages": self.pages}))
        return out


class Ocr:
    def __call__(self, pages: list[Any]) -> list[Any]:
        return pages


class Assemble:
    def __call__(self, texts: list[Any], metas: list[Any]) -> list[Any]:
        return [meta["pages"] for meta in metas]


class PageChildren(ro.Pipeline):
    def __init__(self, pages: int, children: bool) -> None:
        super().__init__()
        self.render = ro.RayModule(Render, pages=pages, children=children, num_outputs=3,
                                   batch_size=2)
        self.ocr = ro.RayModule(Ocr, batch_size=16)
        self.assemble = ro.RayModule(Assemble, batch_size=8)

    def forward(self, docs: Any) -> Any:
        pages, to_ocr, meta = self.render(docs)
        page, wanted = F.expand_aligned(pages, to_ocr)
        return self.assemble(F.reduce(self.ocr(F.filter(page, wanted))), meta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=142)
    parser.add_argument("--pages", type=int, default=14)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    best: dict[bool, float] = {}
    for _ in range(args.repeat):
        for children in (False, True):
            plan = PageChildren(args.pages, children).compile()
            started = time.process_time()
            execute(plan, [(f"d{i}.pdf",) for i in range(args.docs)])
            took = time.process_time() - started
            best[children] = min(best.get(children, took), took)
    children = args.docs * args.pages
    print(json.dumps({"documents": args.docs, "children": children,
                      "cpu_s_without_children": round(best[False], 4),
                      "cpu_s_with_children": round(best[True], 4),
                      "us_per_child": round((best[True] - best[False]) / children * 1e6, 1)}))


if __name__ == "__main__":
    main()
