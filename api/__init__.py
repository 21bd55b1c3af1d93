"""The FastAPI service: a thin HTTP adapter over :mod:`traceguard.service` and
:mod:`traceguard.store` (``create_app`` in :mod:`api.app`). No analysis code lives here."""
