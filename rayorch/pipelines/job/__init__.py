"""The shipped jobs' command side: ``rayorch run pdf|video``, the ``--output`` directory,
the summary, and each job's writer of its files. It runs in the driver's process, never in
an actor; it may import :mod:`rayorch.pipelines.document`, never the other way round.
"""
