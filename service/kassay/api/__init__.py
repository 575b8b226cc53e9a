"""kassay's REST front end: FastAPI app, job store, dispatcher to gRPC workers, dashboard.

Import `kassay.api.app.create_app` to build the app; `kassay api|serve|demo` run it.
"""
