"""PLAID (fast-plaid), the reference backend. See :mod:`uibk_embedding.plaid_backend.store`."""
