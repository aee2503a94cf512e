"""The product's settings plus the measurement tools (`bench`): benchmark, loadtest, streamtiming,
jsonpassrate, dtypecheck, clientpassrate. Used by `make benchmark`, `make loadtest` and the test suite; a deployment does not
need it."""

from .settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench"]  # noqa: F405
