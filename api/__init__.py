"""The FastAPI service (see issue: service). It only adapts HTTP to traceguard functions."""
