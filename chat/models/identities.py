"""Accounts made by signing in with the OpenID Connect provider, and who they are there."""

from django.conf import settings
from django.db import models


class OidcIdentity(models.Model):
    """The provider's user behind an account: its issuer and subject (`sub`), the one pair that
    never changes there. An account is found by this pair, never by its e-mail address, which a
    provider's user may be able to set to anyone's."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identity"
    )
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_sign_in_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="oidc_identity_unique")
        ]
        verbose_name = "OIDC identity"
        verbose_name_plural = "OIDC identities"

    def __str__(self):
        return f"{self.subject} at {self.issuer}"
