"""Stage 7: PyTorch operators: tritongrad.op (bare and torch.library), the launch tape, the op's backward,
segments around PyTorch calls, aten overrides.
"""
