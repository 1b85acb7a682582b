"""Cut a model into a chain of stages: linearize, repeated blocks, Hugging Face cutting, the
chunked loss.
"""
