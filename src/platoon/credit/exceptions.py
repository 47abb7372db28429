"""The one exception type of platoon.credit."""


class CreditError(ValueError):
    """Bad input to credit assignment: a malformed trace, an unknown rule, an invalid option."""
