"""The web UI's pages, one module per resource (assembled by :func:`certify.service.ui.ui_router`):

- :mod:`~certify.service.pages.render`: the templates, the page frame, CSRF-checked forms;
- :mod:`~certify.service.pages.session`: ``/``, ``/login``, ``/logout``, ``/ui.css``;
- :mod:`~certify.service.pages.runs`: ``/runs``, ``/runs/{id}`` and its sharing forms;
- :mod:`~certify.service.pages.links`: ``/shared/{secret}`` (share links, no token);
- :mod:`~certify.service.pages.submit`: ``/submit``;
- :mod:`~certify.service.pages.verify`: ``/verify``.
"""
