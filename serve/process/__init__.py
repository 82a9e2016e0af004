"""One server process: the ASGI application that puts the planes together, uvicorn and
gunicorn plumbing, the server's phases and shutdown order, operations endpoints, logging
and memory settings."""
