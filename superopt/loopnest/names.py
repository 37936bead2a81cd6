"""Names the loop-nest builder gives the buffers it adds (a printer declares them under these names)."""


def box_buffer(tensor: str) -> str:
    """The pointer to the running thread's box of input ``tensor`` (``PackAt``)."""
    return f"so_box_{tensor}"


def box_workspace(tensor: str) -> str:
    """The workspace holding every thread's box of input ``tensor``, one slot a thread."""
    return f"so_boxes_{tensor}"
