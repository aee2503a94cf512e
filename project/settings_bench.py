"""The product's settings plus the measurement tools (`bench`): benchmark, loadtest, streamtiming,
jsonpassrate, dtypecheck, clientpassrate. Used by `make benchmark`, `make loadtest` and the test suite; a deployment does not
need it.

It asks for DEBUG (static files from their sources, no collectstatic) and, unless one is given,
makes a secret key for this run, which the servers it starts inherit: the product's settings
have no key of their own to fall back on."""

import os
import secrets

os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("SECRET_KEY", f"bench-and-tests-only-{secrets.token_urlsafe(40)}")

from .settings import *  # noqa: E402, F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench"]  # noqa: F405
