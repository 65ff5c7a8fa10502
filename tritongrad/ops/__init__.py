"""Stage 8: PyTorch operators: tritongrad.op (bare and torch.library), its call as autograd nodes, segments around
PyTorch calls, forward mode, aten overrides; the launch record and the backward they run are host/'s.
"""
