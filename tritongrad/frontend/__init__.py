"""Stage 1: a kernel's source to the flat, SSA program every later stage reads (helpers inlined, control flow
kept as blocks, block pointers rewritten, constexpr branches specialized, stored values forwarded to later
loads).
"""
