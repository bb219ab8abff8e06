"""README's test command (``-n 2 --dist loadfile``) with a lost worker recovered instead of a hung session.

pytest-xdist 3.8's file scheduler (``LoadScopeScheduling``) deadlocks after it replaces a crashed worker: it puts
the dead worker's *completed* files back on the queue as empty work units, and a worker handed one never reports
a completion, the only event that gives it more work (pytest-dev/pytest-xdist#1378, open); and a replacement
worker handed a single one-test file waits for a next test that is never sent (#1327). Seen in this suite: a
worker lost at 98 %, then both workers idle until killed - CI would have run into its time limit instead of
reporting the failure. Here: only files with tests left go back on the queue, and a worker is never left
holding one test with more work to come (it gets the next file, or is told to finish). And a worker that died
between reporting a test and being sent more work is not sent to: the send fails ("cannot send (already closed?)",
an INTERNALERROR that ended the whole session - seen once in this suite's own test under load); the work stays
assigned to it, and its "node down" event, which follows, puts it back on the queue.
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadFileScheduling
from xdist.workermanage import WorkerController


class RecoveringLoadFileScheduling(LoadFileScheduling):
    def remove_node(self, node: WorkerController) -> str | None:
        workload = self.assigned_work.get(node, {})
        for scope in [scope for scope, unit in workload.items() if all(unit.values())]:
            del workload[scope]  # finished: not handed out again
        return super().remove_node(node)

    def _reschedule(self, node: WorkerController) -> None:
        try:
            self._give_work(node)
        except OSError:  # the worker's pipe is closed: it died; remove_node requeues what it held
            pass

    def _give_work(self, node: WorkerController) -> None:
        super()._reschedule(node)
        # A worker runs a test once it knows the next one (or that none follows).
        if node.shutting_down or self._pending_of(self.assigned_work.get(node, {})) != 1:
            return
        if self.workqueue:
            self._assign_work_unit(node)
        else:
            node.shutdown()


def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadFileScheduling | None:
    if config.getvalue("dist") == "loadfile":
        return RecoveringLoadFileScheduling(config, log)
    return None
