"""The graph search: which rewrite rules to apply where (``search``), what a graph costs (``cost``), the
global layout choice (``layout``), and confirming tuned schedules inside the whole graph (``confirm``)."""
