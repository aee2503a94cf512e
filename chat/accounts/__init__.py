"""Accounts and sign-in: sign-up and sign-in with a password (sign_in.py), with the OpenID Connect
provider (oidc_views.py, oidc_backend.py), the forms they share (forms.py), and the signed-in
user's own pages: the account (export, delete) and its API keys."""
