"""Forward mode: the tangent kernel of a forward kernel (builder.py), its operations' tangents from the table of
operations the reverse rules come from (rules.py)."""
