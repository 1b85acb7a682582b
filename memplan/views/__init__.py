"""Views of a schedule: a Chrome trace-event file (:mod:`.trace`) and a figure (:mod:`.plot`).

Neither imports torch; :mod:`.plot` imports matplotlib (the ``plot`` extra) when it draws.
"""

from memplan.views.trace import trace_events, write_trace

__all__ = ["trace_events", "write_trace"]
