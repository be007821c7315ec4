"""Applications: the ``uibk-embed`` command line, collection readers, evaluation, the backend
comparison and distributed indexing.

The top layer of the package (docs/architecture.md): it may import every layer below it (the
ground floor ``uibk_embedding``, ``encoder``, ``adapters``, ``plaid_backend``,
``integrations``, ``testing``); nothing below imports it.

>>> from uibk_embedding.apps.cli import main
>>> callable(main)
True
"""
