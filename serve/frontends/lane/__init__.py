"""The local lane: calls from processes on the same host, with arrays in shared memory."""
