"""FastAPI routers for the endpoints off the scoring path: the ledger and ops. Scoring routes
(engine-shaped and rewards) are declared once in ``gateway.http.routes.scoring_router``."""
