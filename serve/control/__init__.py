"""The control plane: the model repository on disk, each model's lifecycle (versions, ready
states, its scheduler), live updates, the repository watcher, and their HTTP endpoints."""
