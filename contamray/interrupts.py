"""What stops a run from outside, and how the parts of a run say they stopped.

``STOPPED``: the exceptions a stop raises in the driver's main thread - ``KeyboardInterrupt`` (Ctrl-C) and
``SystemExit`` (SIGTERM: ``ray job stop``, a scheduler, ``kill``; the handler ``ray.init`` installs in a driver
turns it into ``sys.exit(15)``). The driver then sets its ``EnginePools.stopping`` event, and every part that
waits on the cluster in another thread - a stage's batches (``pipeline/engine_pool.py``), a deployment coming up
(``serve/hosting.py``), an injected model's fine-tune (``pipeline/injections.py``) - stops waiting and raises
``RunInterrupted``, keeping what it finished.
"""

from __future__ import annotations

STOPPED = (KeyboardInterrupt, SystemExit)


class RunInterrupted(Exception):
    """The run was told to stop (Ctrl-C, SIGTERM) while this part of it waited on the cluster."""
