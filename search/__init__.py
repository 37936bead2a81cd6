"""The choosing layer: the graph search (``search.graph``) and the schedule search (``search.schedule``)."""
