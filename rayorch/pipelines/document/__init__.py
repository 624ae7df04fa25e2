"""What runs inside a document job's actors: render, text-layer Markdown, tables, OCR
engines, page OCR and assembly (and the region grain's layout and recognition).

Nothing here imports the jobs' command side (:mod:`rayorch.pipelines.job`);
``tests/unit/test_layering.py`` holds that rule.
"""
