"""The IR every stage reads and the facts it keys on: errors, the table of operations, the normalized program's
types and accessors (ir), the Triton helpers derived kernels call (language, as `tg`), a kernel's source, and
the device's facts.
"""
