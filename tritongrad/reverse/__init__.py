"""Stage 4: the backward body: the forward recomputed, the reverse sweep, loops reversed (recomputed, linear,
taped), memory adjoints, loop interchange and the persistent wrap.
"""
