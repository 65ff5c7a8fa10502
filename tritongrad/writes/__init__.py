"""Stage 3: how each input's gradient reaches memory (write strategies), the conditions each needs, and the
launch facts they are chosen on.
"""
