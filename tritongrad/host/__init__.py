"""Stage 7: the host side of an op's calls and backwards: Triton's launches recorded on a launch record (hooks, kernel
roles), a kind of call planned once (hazards, shadow layouts), the backward's launches in reverse order, repeated
backwards and calls replayed past the launch record, storage donation, buffers made again for a double backward, and the
backward torch.compile calls. Nothing here is what a user calls: ops/ builds the operator on it.
"""
