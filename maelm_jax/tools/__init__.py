"""Tools beside the product: fault injection, profiles and compiled programs read back."""
