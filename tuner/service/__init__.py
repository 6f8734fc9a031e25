"""The HTTP service: its API (FastAPI on Ray Serve) and the client that asks it over HTTP."""
