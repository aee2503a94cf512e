"""What the loopback provider says about a user: user name, e-mail address and Django groups
as a `groups` claim (under the `groups` scope), as Keycloak's group mapper does; optionally ID
tokens signed without a `kid` in their header, as providers with one key may."""

import json

from jwcrypto import jwt
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
        key = request.client.jwk_key
        signed = jwt.JWT(
            jwt=super().finalize_id_token(id_token, token, token_handler, request), key=key
        )
        header = {name: value for name, value in json.loads(signed.header).items() if name != "kid"}
        again = jwt.JWT(header=json.dumps(header), claims=signed.claims)
        again.make_signed_token(key)
        return again.serialize()
