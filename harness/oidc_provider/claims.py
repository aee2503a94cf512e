"""What the loopback provider says about a user: user name, e-mail address and Django groups
as a `groups` claim (under the `groups` scope), as Keycloak's group mapper does; optionally ID
tokens signed without a `kid` in their header, as providers with one key may."""

import jwt
from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsClaimValidator(OAuth2Validator):
    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "groups"}

    def get_additional_claims(self, request):
        user = request.user
        return {
            "preferred_username": user.username,
            "email": user.email,
            "groups": sorted(group.name for group in user.groups.all()),
        }


class GroupsClaimValidatorWithoutKid(GroupsClaimValidator):
    def finalize_id_token(self, id_token, token, token_handler, request):
        """The ID token django-oauth-toolkit signs, signed again with a header without `kid`."""
        signed = super().finalize_id_token(id_token, token, token_handler, request)
        claims = jwt.decode(signed, options={"verify_signature": False})
        pem = request.client.jwk_key.export_to_pem(private_key=True, password=None)
        return jwt.encode(claims, pem, algorithm="RS256", headers={"typ": "JWT"})
