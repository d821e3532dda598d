"""Scale-out on Ray (``--workers N``): one driver, N worker actors, one rate limit and one budget.

The modules, driver side first::

    backend    RayBackend: chosen by name, it opens the driver (the workers open clients)
    connect    reaching Ray: join a cluster or start a local instance
    driver     the refine process: reader, journal and outputs; records to workers and back
    messages   what the driver and a worker say to each other (one exchange call at a time)
    pacing     one rate limit for the cluster: the driver books time slots in blocks
    spending   one --budget for the cluster: workers reserve against the driver's Budget
    jobfiles   sending a job's files to a worker, which loads the job itself
    worker     the actor: the same loop and client as a single process, on the records given

Importing this package does not import Ray; starting a run does (``refine[ray]``).
"""

from .backend import RayBackend
from .driver import RayDriver

backend_class = RayBackend  # what ``pipeline.backends.named("ray")`` builds

__all__ = ["RayBackend", "RayDriver", "backend_class"]
