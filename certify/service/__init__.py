"""``certify serve``: the certification service.

An edge like the CLI: the API and web UI (:mod:`.app`) put runs on a durable queue in the
database (:mod:`.db`, :mod:`.queue`); worker threads (:mod:`.workers`) claim them with a lease
and run each in its own process (:mod:`.job`), forked by the worker slot's warm job host
(:mod:`.jobhost`), which calls the same library entry point as ``certify run``
(:func:`certify.api.certify_model`). The server's signing key signs every card
it issues, and every issued card is appended to a Merkle-tree transparency log (:mod:`.tlog`).
"""
