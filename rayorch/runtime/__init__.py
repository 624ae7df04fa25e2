"""The driver's moving parts: the run session (Ray, store, leases, pools) and the loop."""
