"""Repository tools (not installed with the package): see tools/execute_notebooks.py."""
