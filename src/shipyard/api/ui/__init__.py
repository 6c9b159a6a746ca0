"""The web dashboard: server-rendered pages over the same service layer and RBAC as the API.

Why this stack: Jinja2 templates rendered by the server (every permission check stays in the
service layer, and a page is one request a benchmark can time), htmx for the parts that refresh
in place, and uPlot for the curves (50 KB, draws a million points). No build step: the few
third-party files ship in ``static/vendor`` (versions and licences in its README), so the
dashboard, and Swagger UI behind ``/docs``, work with no network (ReDoc is left out: it loads
its logo from a CDN whatever its options).

Sign-in issues a login token kept in an HttpOnly, SameSite=Strict session cookie; every form
that changes something carries the session's CSRF token (``api.deps.csrf_token``), and the API
accepts the same session (with the token in a header) for the pages' scripts.
"""

from shipyard.api.ui.pages import install

__all__ = ["install"]
