"""Stage 2: what the program does with its memory and values: pointers and roles, activity, shapes, affine
address forms and the launch conditions built from them, store legality, and the rewrites those facts prove
safe (an online softmax's max, composites, stored values read back).
"""
