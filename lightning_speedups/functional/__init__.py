"""Plain-PyTorch functions, usable without Lightning: each does one technique in place and returns a summary."""
