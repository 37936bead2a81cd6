"""The schedule search: one kernel's search over sketches and knobs (``search``), random legal traces
(``random_schedule``), search in the cost model (``model_guided``), the tuning database (``database``), and
tuning every kernel of a graph within one budget (``tune``). The space it searches and what a trace means
live in ``superopt.schedule``; measuring in ``superopt.measure``; the cost model in ``costmodel``."""
