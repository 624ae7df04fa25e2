"""The virtual-clock simulator: the real kernel scheduler, actors as event-heap timers.

``engine`` is the generic discrete-event loop (any compiled Plan, any cost model),
``corpus`` the paper's corpus shape, ``paper`` the PDF pipeline workload and its bounds;
``bench/sim.py`` is the command line.
"""
