"""Around the pipeline: the command line, gradient checks against PyTorch, benchmarks, the demo, and testing
helpers.
"""
