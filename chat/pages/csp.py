"""Content-Security-Policy on every response (Django 5.2 has no middleware for it; 6.0 will).

The page and the admin load scripts and styles from this site only and run no inline
script, so a strict policy costs nothing and stops an injected `<script>` or a page
framing the chat.
"""

from __future__ import annotations

from django.conf import settings
from django.utils.deprecation import MiddlewareMixin


class ContentSecurityPolicyMiddleware(MiddlewareMixin):
    """Adds settings.CONTENT_SECURITY_POLICY to responses that set none; empty turns it off."""

    def process_response(self, request, response):
        policy = settings.CONTENT_SECURITY_POLICY
        if policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy
        return response
