"""The data plane: protocol frontends -> neutral request -> scheduler -> runtime -> neutral
response. Nothing here imports the control plane; it finds models through
``routing.Router`` and versions through ``model.VersionSource``."""
