"""Stage 6: derived kernels at run time: derivation and its cache (grad, vjp), the backward kernel's variants and
launches, tuning, direct relaunches, the augmented forward, custom rules.
"""
