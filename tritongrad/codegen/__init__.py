"""Stage 5: the backward body as readable, fast Triton source (products transposed, loops split at masks,
exponentials in base two, loads issued early), compiled with triton.jit.
"""
